//! A deliberately small evaluator for the subset of Go's text/template (as
//! extended by Helm) that `charts/ipsetmgr/templates` uses, so the tests can
//! render the chart without a `helm` binary (none is packaged for this
//! machine's registries).
//!
//! Supported: text; `{{ … }}` actions with `{{-`/`-}}` whitespace trimming;
//! `{{/* comments */}}`; field chains on the root (`.Values.a.b`,
//! `.Release.Namespace`, `.Chart.AppVersion`) and `.` itself; string
//! (`"…"` and raw `` `…` ``), integer and boolean literals; parenthesised
//! pipelines as arguments; pipelines `a | f x`; `if`/`else`/`end`;
//! `define`/`include`; the one method call `.Capabilities.APIVersions.Has
//! "group/version/Kind"` (the test gives `Capabilities.APIVersions` as a list);
//! and the functions `default`, `trunc`, `trimSuffix`, `quote`, `toYaml`,
//! `toString`, `indent`, `nindent`, `eq`, `ne`, `and`, `or`, `not` and `fail`.
//!
//! Limitations (honestly): no `with`/`range`/variables/`else if`, no `tpl`,
//! no `.Files`, no other `.Capabilities`; `and`/`or` evaluate all their
//! arguments (Go stops early; the same result when no argument fails);
//! `toYaml` formats with serde-saphyr rather than Go's yaml library (same
//! data, maybe different quoting), and `quote` escapes like JSON rather than
//! Go's `%q`. It is stricter than Helm: a missing value key or printing a
//! map/list without `toYaml` is an error, which catches typos in templates
//! and values; `eq`/`ne` refuse numbers, because Helm holds a number from a
//! values file as float64 and one from `--set` as int64, and Go's `eq` fails
//! on the pair: compare `toString` of both instead. Anything outside the
//! subset is an error, never silently rendered, so a template that drifts
//! from the subset fails the tests instead of being half-checked.

use std::collections::HashMap;

use serde_json::Value;

#[derive(Debug)]
enum Node {
    Text(String),
    Output(String),
    If {
        cond: String,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

pub struct Templates {
    defines: HashMap<String, Vec<Node>>,
}

enum Tok {
    Text(String),
    Action(String),
}

/// Where the action that `body` starts ends (the index of its `}}`), skipping
/// `}}` inside string literals and comments, as Go's lexer does.
fn action_end(body: &str) -> Option<usize> {
    if let Some(comment) = body.strip_prefix("/*") {
        let close = comment.find("*/")? + 4;
        let rest = &body[close..];
        let rest_trimmed = rest.strip_prefix(" -").unwrap_or(rest);
        return rest_trimmed
            .starts_with("}}")
            .then_some(close + (rest.len() - rest_trimmed.len()));
    }
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'`' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'`' {
                    i += 1;
                }
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let mut toks = Vec::new();
    let mut rest = src;
    let mut trim_next = false;
    while !rest.is_empty() {
        let (text, after) = match rest.find("{{") {
            Some(i) => (&rest[..i], Some(&rest[i + 2..])),
            None => (rest, None),
        };
        let mut text = text.to_string();
        if trim_next {
            text = text.trim_start().to_string();
        }
        let Some(after) = after else {
            toks.push(Tok::Text(text));
            break;
        };
        let (trim_before, body_start) = match after.strip_prefix("- ") {
            Some(b) => (true, b),
            None => (false, after),
        };
        if trim_before {
            text = text.trim_end().to_string();
        }
        toks.push(Tok::Text(text));
        let end = action_end(body_start).ok_or_else(|| "unclosed action {{".to_string())?;
        let mut body = &body_start[..end];
        trim_next = false;
        if let Some(b) = body.strip_suffix(" -") {
            body = b;
            trim_next = true;
        }
        let body = body.trim();
        if !(body.starts_with("/*") && body.ends_with("*/")) {
            toks.push(Tok::Action(body.to_string()));
        }
        rest = &body_start[end + 2..];
    }
    Ok(toks)
}

/// Parse tokens into nodes until an `end` (or `else`) closes the block.
fn parse_block(
    toks: &mut std::iter::Peekable<std::vec::IntoIter<Tok>>,
    defines: &mut HashMap<String, Vec<Node>>,
    top: bool,
) -> Result<(Vec<Node>, Option<&'static str>), String> {
    let mut nodes = Vec::new();
    while let Some(tok) = toks.next() {
        match tok {
            Tok::Text(t) => {
                if !t.is_empty() {
                    nodes.push(Node::Text(t));
                }
            }
            Tok::Action(a) => {
                let (kw, rest) = a.split_once(' ').unwrap_or((a.as_str(), ""));
                match kw {
                    "end" => return Ok((nodes, Some("end"))),
                    "else" if rest.is_empty() => return Ok((nodes, Some("else"))),
                    "if" => {
                        let (then, closer) = parse_block(toks, defines, false)?;
                        let otherwise = match closer {
                            Some("else") => match parse_block(toks, defines, false)? {
                                (o, Some("end")) => o,
                                _ => return Err("if/else without end".into()),
                            },
                            Some("end") => Vec::new(),
                            _ => return Err("if without end".into()),
                        };
                        nodes.push(Node::If {
                            cond: rest.trim().to_string(),
                            then,
                            otherwise,
                        });
                    }
                    "define" => {
                        let name = unquote(rest.trim())?;
                        match parse_block(toks, defines, false)? {
                            (body, Some("end")) => {
                                defines.insert(name, body);
                            }
                            _ => return Err(format!("define {name:?} without end")),
                        }
                    }
                    "with" | "range" | "else" | "block" | "template" => {
                        return Err(format!("unsupported action {a:?} (outside the subset)"));
                    }
                    _ => nodes.push(Node::Output(a.clone())),
                }
            }
        }
    }
    if top {
        Ok((nodes, None))
    } else {
        Err("block without end".into())
    }
}

fn unquote(s: &str) -> Result<String, String> {
    serde_json::from_str::<String>(s).map_err(|e| format!("bad string literal {s}: {e}"))
}

/// Split on `sep` outside string literals (`"…"`, `` `…` ``) and parentheses.
fn split_outside_quotes(s: &str, sep: impl Fn(char) -> bool) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut depth = 0usize;
    for c in s.chars() {
        if let Some(q) = quote {
            cur.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' && q == '"' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
        } else if c == '"' || c == '`' {
            quote = Some(c);
            cur.push(c);
        } else if c == '(' {
            depth += 1;
            cur.push(c);
        } else if c == ')' {
            depth = depth.saturating_sub(1);
            cur.push(c);
        } else if depth == 0 && sep(c) {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts
}

pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn as_str(v: &Value, what: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("{what}: cannot print {other} as text (use toYaml)")),
    }
}

fn as_int(v: &Value, what: &str) -> Result<usize, String> {
    v.as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| format!("{what}: expected an integer, got {v}"))
}

fn indent(n: usize, s: &str) -> String {
    let pad = " ".repeat(n);
    s.split('\n')
        .map(|l| format!("{pad}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Templates {
    /// Parse every template file (helpers first) and collect their defines.
    pub fn new(helpers: &[&str]) -> Result<Templates, String> {
        let mut defines = HashMap::new();
        for src in helpers {
            let mut toks = lex(src)?.into_iter().peekable();
            parse_block(&mut toks, &mut defines, true)?;
        }
        Ok(Templates { defines })
    }

    /// Render one template file against `root` (`.`).
    pub fn render(&mut self, src: &str, root: &Value) -> Result<String, String> {
        let mut toks = lex(src)?.into_iter().peekable();
        let (nodes, _) = parse_block(&mut toks, &mut self.defines, true)?;
        let mut out = String::new();
        self.exec(&nodes, root, &mut out, 0)?;
        Ok(out)
    }

    fn exec(
        &self,
        nodes: &[Node],
        root: &Value,
        out: &mut String,
        depth: usize,
    ) -> Result<(), String> {
        if depth > 20 {
            return Err("include nesting too deep".into());
        }
        for n in nodes {
            match n {
                Node::Text(t) => out.push_str(t),
                Node::Output(p) => {
                    let v = self.pipeline(p, root, depth)?;
                    out.push_str(&as_str(&v, p)?);
                }
                Node::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let v = self.pipeline(cond, root, depth)?;
                    let branch = if truthy(&v) { then } else { otherwise };
                    self.exec(branch, root, out, depth)?;
                }
            }
        }
        Ok(())
    }

    fn arg(&self, a: &str, root: &Value, depth: usize) -> Result<Value, String> {
        if a == "." {
            return Ok(root.clone());
        }
        if let Some(inner) = a.strip_prefix('(').and_then(|x| x.strip_suffix(')')) {
            return self.pipeline(inner, root, depth);
        }
        if a.starts_with('"') {
            return unquote(a).map(Value::String);
        }
        if let Some(raw) = a.strip_prefix('`').and_then(|x| x.strip_suffix('`')) {
            return Ok(Value::String(raw.to_string()));
        }
        if let Ok(n) = a.parse::<i64>() {
            return Ok(Value::from(n));
        }
        if a == "true" || a == "false" {
            return Ok(Value::Bool(a == "true"));
        }
        if let Some(path) = a.strip_prefix('.') {
            let mut v = root;
            for key in path.split('.') {
                v = v
                    .get(key)
                    .ok_or_else(|| format!("{a}: no key {key:?} (missing from values?)"))?;
            }
            return Ok(v.clone());
        }
        Err(format!("unsupported argument {a:?}"))
    }

    /// `.Capabilities.APIVersions.Has "x"`, the one method call of the subset.
    fn method(&self, words: &[String], root: &Value, depth: usize) -> Result<Value, String> {
        let call = words.join(" ");
        let receiver = words[0]
            .strip_suffix(".Has")
            .filter(|r| *r == ".Capabilities.APIVersions")
            .ok_or_else(|| format!("{call:?}: a value cannot take arguments"))?;
        let [_, arg] = words else {
            return Err(format!("{call:?}: Has takes one argument"));
        };
        let list = self.arg(receiver, root, depth)?;
        let list = list
            .as_array()
            .ok_or_else(|| format!("{call:?}: {receiver} is not a list"))?;
        let want = self.arg(arg, root, depth)?;
        Ok(Value::Bool(list.contains(&want)))
    }

    fn pipeline(&self, p: &str, root: &Value, depth: usize) -> Result<Value, String> {
        let mut piped: Option<Value> = None;
        for cmd in split_outside_quotes(p, |c| c == '|') {
            let words: Vec<String> = split_outside_quotes(cmd.trim(), char::is_whitespace)
                .into_iter()
                .filter(|w| !w.is_empty())
                .collect();
            let Some(first) = words.first() else {
                return Err(format!("empty command in {p:?}"));
            };
            let is_func = first
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic())
                && first != "true"
                && first != "false";
            let value = if is_func {
                let mut args = words[1..]
                    .iter()
                    .map(|w| self.arg(w, root, depth))
                    .collect::<Result<Vec<_>, _>>()?;
                args.extend(piped.take());
                self.call(first, &args, depth)
                    .map_err(|e| format!("{p:?}: {e}"))?
            } else if piped.is_some() {
                return Err(format!("{p:?}: a value cannot take arguments"));
            } else if words.len() > 1 {
                self.method(&words, root, depth)?
            } else {
                self.arg(first, root, depth)?
            };
            piped = Some(value);
        }
        piped.ok_or_else(|| format!("empty pipeline {p:?}"))
    }

    fn call(&self, f: &str, args: &[Value], depth: usize) -> Result<Value, String> {
        let want = |n: usize| {
            if args.len() == n {
                Ok(())
            } else {
                Err(format!("{f} takes {n} arguments, got {}", args.len()))
            }
        };
        let s = |v: &Value| as_str(v, f);
        Ok(match f {
            "include" => {
                want(2)?;
                let name = s(&args[0])?;
                let body = self
                    .defines
                    .get(&name)
                    .ok_or_else(|| format!("no template {name:?} defined"))?;
                let mut out = String::new();
                self.exec(body, &args[1], &mut out, depth + 1)?;
                Value::String(out)
            }
            "default" => {
                want(2)?;
                if truthy(&args[1]) {
                    args[1].clone()
                } else {
                    args[0].clone()
                }
            }
            "trunc" => {
                want(2)?;
                let n = as_int(&args[0], f)?;
                Value::String(s(&args[1])?.chars().take(n).collect())
            }
            "trimSuffix" => {
                want(2)?;
                let (suf, v) = (s(&args[0])?, s(&args[1])?);
                Value::String(v.strip_suffix(suf.as_str()).unwrap_or(&v).to_string())
            }
            "quote" => {
                want(1)?;
                Value::String(serde_json::to_string(&s(&args[0])?).unwrap())
            }
            "toYaml" => {
                want(1)?;
                let y = serde_saphyr::to_string(&args[0]).map_err(|e| e.to_string())?;
                // Helm's toYaml drops the final newline.
                Value::String(y.trim_end_matches('\n').to_string())
            }
            "indent" => {
                want(2)?;
                Value::String(indent(as_int(&args[0], f)?, &s(&args[1])?))
            }
            "nindent" => {
                want(2)?;
                Value::String(format!("\n{}", indent(as_int(&args[0], f)?, &s(&args[1])?)))
            }
            "toString" => {
                want(1)?;
                Value::String(s(&args[0])?)
            }
            "eq" | "ne" => {
                want(2)?;
                let comparable = |v: &Value| matches!(v, Value::String(_) | Value::Bool(_));
                if !(comparable(&args[0]) && comparable(&args[1])) {
                    return Err(format!(
                        "{f} compares strings or booleans only, got {} and {} (compare \
                         numbers as `toString`: Helm reads them as float64 from a values \
                         file and int64 from --set, and Go's eq fails on the two)",
                        args[0], args[1]
                    ));
                }
                Value::Bool((args[0] == args[1]) == (f == "eq"))
            }
            "and" | "or" => {
                if args.is_empty() {
                    return Err(format!("{f} takes at least one argument"));
                }
                // Go's: the first argument that decides, else the last.
                let decides = |v: &&Value| truthy(v) == (f == "or");
                args.iter()
                    .find(decides)
                    .unwrap_or(&args[args.len() - 1])
                    .clone()
            }
            "not" => {
                want(1)?;
                Value::Bool(!truthy(&args[0]))
            }
            "fail" => {
                want(1)?;
                return Err(format!("fail: {}", s(&args[0])?));
            }
            _ => return Err(format!("function {f:?} is outside the supported subset")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(helpers: &str, src: &str, root: Value) -> Result<String, String> {
        Templates::new(&[helpers])?.render(src, &root)
    }

    #[test]
    fn subset_behaves_like_go_templates() {
        let root = json!({"Values": {"a": {"b": 3}, "e": "", "m": {"k": "v"}, "l": []},
                          "Release": {"Name": "rel"}});
        let h = r#"{{- define "n" -}}{{ default .Release.Name .Values.e | trunc 2 }}{{- end }}"#;
        assert_eq!(
            render(h, "x: {{ .Values.a.b }}", root.clone()).unwrap(),
            "x: 3"
        );
        assert_eq!(
            render(h, "x:  {{- include \"n\" . }}", root.clone()).unwrap(),
            "x:re"
        );
        assert_eq!(
            render(h, "{{ .Values.a.b | quote }}", root.clone()).unwrap(),
            "\"3\""
        );
        assert_eq!(
            render(
                h,
                "a:\n  {{- toYaml .Values.m | nindent 2 }}\n",
                root.clone()
            )
            .unwrap(),
            "a:\n  k: v\n"
        );
        assert_eq!(
            render(
                h,
                "{{- if .Values.l }}yes{{- else }}no{{- end }}",
                root.clone()
            )
            .unwrap(),
            "no"
        );
        assert_eq!(render(h, "a {{/* c */}}b", root.clone()).unwrap(), "a b");
        assert!(render(h, "{{ .Values.nope }}", root.clone()).is_err());
        assert!(render(h, "{{ .Values.m }}", root.clone()).is_err());
        assert!(render(h, "{{ range .Values.l }}{{ end }}", root.clone()).is_err());
        assert!(render(h, "{{ lower .Values.e }}", root).is_err());
    }

    #[test]
    fn capabilities_comparisons_literals_and_fail() {
        let root = json!({"Values": {"on": true, "off": false, "s": "a", "n": 7},
                          "Capabilities": {"APIVersions": ["v1", "example.com/v1/Thing"]}});
        let r = |src: &str| render("", src, root.clone());
        let has =
            r#"{{ if .Capabilities.APIVersions.Has "example.com/v1/Thing" }}y{{ else }}n{{ end }}"#;
        assert_eq!(r(has).unwrap(), "y");
        let lacks =
            r#"{{ if .Capabilities.APIVersions.Has "example.com/v1/Other" }}y{{ else }}n{{ end }}"#;
        assert_eq!(r(lacks).unwrap(), "n");
        // Only Has, only on APIVersions.
        assert!(r(r#"{{ .Capabilities.APIVersions.Get "v1" }}"#).is_err());
        assert!(r(r#"{{ .Values.s.Has "v1" }}"#).is_err());
        // Parentheses, and/or returning the deciding argument, not.
        let gate = r#"{{ if and .Values.on (or .Values.off (.Capabilities.APIVersions.Has "v1")) }}y{{ end }}"#;
        assert_eq!(r(gate).unwrap(), "y");
        assert_eq!(r("{{ and .Values.on .Values.s }}").unwrap(), "a");
        assert_eq!(r("{{ or .Values.off .Values.s }}").unwrap(), "a");
        assert_eq!(r("{{ not .Values.off }}").unwrap(), "true");
        // eq on strings; numbers only through toString (Helm's float64/int64).
        assert_eq!(r(r#"{{ eq .Values.s "a" }}"#).unwrap(), "true");
        assert_eq!(r(r#"{{ ne .Values.s "a" }}"#).unwrap(), "false");
        assert!(r("{{ eq .Values.n 7 }}").is_err());
        assert_eq!(
            r(r#"{{ eq (toString .Values.n) (.Values.n | toString) }}"#).unwrap(),
            "true"
        );
        // `}}` inside string literals does not end the action; raw strings
        // print Prometheus' own templates verbatim.
        assert_eq!(r(r#"{{ "}}" }}"#).unwrap(), "}}");
        assert_eq!(
            r("a {{`{{ $labels.policy }}`}} b").unwrap(),
            "a {{ $labels.policy }} b"
        );
        assert_eq!(r(r#"a {{- /* "}}" */ -}} b"#).unwrap(), "ab");
        let e = r(r#"{{ if .Values.on }}{{ fail "no way" }}{{ end }}"#).unwrap_err();
        assert!(e.contains("fail: no way"), "{e}");
    }
}
