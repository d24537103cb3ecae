//! No `Result<_, String>` in production code (issue 31): errors in the
//! crates are typed (thiserror), so callers can tell them apart and tests
//! can match on them. Read from the source text: every `Result<A, B>`
//! whose second argument is `String`, however nested `A` is and across
//! lines, outside comments, `tests/` directories, `tests.rs` files and
//! `#[cfg(test)]` modules. Each hit is named `path: fn` (the nearest `fn`
//! before it).

use std::path::{Path, PathBuf};

/// The hits of one file's text, each named by the nearest `fn` before it.
pub fn hits(text: &str) -> Vec<String> {
    let code = production(text);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("Result<") {
        let start = from + at;
        from = start + "Result<".len();
        // A longer name (`ParseResult<`) is not `Result`.
        if code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        if second_argument(&code[from..]).as_deref() == Some("String") {
            out.push(enclosing_fn(&code[..start]));
        }
    }
    out
}

/// The second type argument of `Result<…>`, given the text after `<` (a
/// trailing comma allowed).
fn second_argument(rest: &str) -> Option<String> {
    let mut depth = 0usize;
    let mut args = Vec::new();
    let mut start = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth > 0 => depth -= 1,
            '>' | ',' if depth == 0 => {
                args.push(rest[start..i].split_whitespace().collect::<String>());
                if c == '>' {
                    args.retain(|a| !a.is_empty());
                    return args.get(1).cloned();
                }
                start = i + 1;
            }
            ';' | '{' => return None,
            _ => {}
        }
    }
    None
}

fn enclosing_fn(before: &str) -> String {
    before
        .rmatch_indices("fn ")
        .find(|(i, _)| {
            before[..*i]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .map(|(i, _)| {
            before[i + 3..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .unwrap_or_else(|| "?".into())
}

/// The text without line comments and without `#[cfg(test)]` modules.
fn production(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let code = line.split("//").next().unwrap_or("");
        if code.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|l| l.trim_start().starts_with("mod ") && l.contains('{'))
        {
            // Skip the module: to the line where its braces close.
            let mut depth = 0i64;
            for l in lines.by_ref() {
                let l = l.split("//").next().unwrap_or("");
                depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
                if depth <= 0 && l.contains('}') {
                    break;
                }
            }
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every production `.rs` file under `dir` (no `tests/`, no `tests.rs`).
pub fn production_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        if path.is_dir() {
            if name != "tests" {
                production_files(&path, out);
            }
        } else if path.extension().is_some_and(|x| x == "rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}
