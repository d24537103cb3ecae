//! The module graph of one crate, read from its source files
//! (docs/architecture.md, "Crates"): an edge `a -> b` when code in `a`
//! names an item that `b` defines.
//!
//! Names are followed through `use` declarations of any module, the crate
//! root included, to the module that defines them: `super::Plan`, where the
//! parent only re-exports `batch::Plan`, is an edge to `batch`, not to the
//! parent. A re-export (`pub use`, `pub(crate) use`, …) is not itself an
//! edge: it passes names through and runs no code. An item an ancestor
//! defines is an edge to that ancestor like any other (a child using its
//! parent's type while the parent calls into the child is a circle).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path, `""` for the crate root.
type ModPath = String;

/// A crate's modules, by path, and their files.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                out.insert(parts.join("::"), path);
            }
        }
    }
    out
}

/// The code of a file that counts: no comments, no inline test module
/// (tests may import anything).
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.trim_end().ends_with('{'))
        {
            break;
        }
        if !t.starts_with("//") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The paths a `use` tree names, each with the name it binds:
/// `a::{b, c::{d as e}}` is (a::b, b) and (a::c::d, e); `a::{self}` is
/// (a, a); a glob binds `*`.
fn expand(tree: &str) -> Vec<(String, String)> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let mut it = tree.split(" as ");
        let path = it.next().unwrap().trim();
        let path = path.strip_suffix("::self").unwrap_or(path).to_string();
        let name = match it.next() {
            Some(alias) => alias.trim().to_string(),
            None => path.rsplit("::").next().unwrap().trim().to_string(),
        };
        return vec![(path, name)];
    };
    let prefix = &tree[..open];
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(&format!("{prefix}{}", p.trim())))
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Does this file's code define an item called `name` (for glob re-exports)?
fn defines(text: &str, name: &str) -> bool {
    const KINDS: [&str; 9] = [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ", "union ",
    ];
    KINDS.iter().any(|k| {
        text.match_indices(&format!("{k}{name}")).any(|(i, m)| {
            let before = text[..i].chars().next_back();
            let after = text[i + m.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
    })
}

/// One `use` declaration's binding.
struct Binding {
    /// Where the path points, as segments from the crate root; `None` for
    /// another crate (or std).
    target: Option<Vec<String>>,
    /// `pub`, `pub(crate)`, `pub(super)` …: a re-export, not an edge.
    reexport: bool,
}

/// One module as read from its file.
struct Module {
    here: Vec<String>,
    /// What `super` means in this file.
    parent: Vec<String>,
    text: String,
    /// `text` without its `use` declarations.
    text_without_uses: String,
    /// The names its `use` declarations bind (a glob binds `*`, possibly
    /// more than once).
    bindings: Vec<(String, Binding)>,
    /// Paths its code names (`crate::…`, `super::…`, `child::…`), as
    /// segments from the crate root.
    paths: Vec<Vec<String>>,
}

/// A crate's modules with what each binds and names.
pub struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl Crate {
    /// Read the crate whose root file (`lib.rs` or `main.rs`) is in `src`.
    pub fn read(src: &Path) -> Crate {
        let files = modules(src);
        let names: BTreeSet<ModPath> = files.keys().cloned().collect();
        let mut modules = BTreeMap::new();
        for (name, file) in &files {
            let text = code(&std::fs::read_to_string(file).unwrap());
            let here = segments(name);
            let parent = here[..here.len().saturating_sub(1)].to_vec();
            let mut m = Module {
                here,
                parent,
                text,
                text_without_uses: String::new(),
                bindings: Vec::new(),
                paths: Vec::new(),
            };
            m.read_uses(&names);
            m.read_code_paths(&names);
            modules.insert(name.clone(), m);
        }
        Crate { modules }
    }

    /// The module that defines what `segs` (from the crate root) names,
    /// following `use` bindings; `None` when it is another crate's.
    fn resolve(&self, segs: &[String], depth: usize) -> Option<ModPath> {
        if depth > 32 {
            return None;
        }
        let mut m: Vec<String> = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            if s == "*" {
                break;
            }
            let mut child = m.clone();
            child.push(s.clone());
            if self.modules.contains_key(&child.join("::")) {
                m = child;
                continue;
            }
            let module = &self.modules[&m.join("::")];
            if let Some((_, b)) = module.bindings.iter().find(|(name, _)| name == s) {
                let mut next = b.target.clone()?;
                next.extend(segs[i + 1..].iter().cloned());
                return self.resolve(&next, depth + 1);
            }
            // An item defined here wins over a glob import of the same name.
            if defines(&module.text, s) {
                break;
            }
            let globs = module
                .bindings
                .iter()
                .filter(|(name, _)| name == "*")
                .filter_map(|(_, b)| b.target.as_ref());
            for g in globs {
                let from = self.resolve(g, depth + 1);
                if let Some(from) = from.filter(|f| defines(&self.modules[f].text, s)) {
                    return Some(from);
                }
            }
            break;
        }
        Some(m.join("::"))
    }

    /// The module graph: an edge `a -> b` when `a` names something `b`
    /// defines.
    pub fn graph(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut graph = BTreeMap::new();
        for (name, m) in &self.modules {
            let mut edges = BTreeSet::new();
            let used = m
                .bindings
                .iter()
                .filter(|(_, b)| !b.reexport)
                .filter_map(|(_, b)| b.target.as_ref())
                .chain(m.paths.iter());
            for segs in used {
                if let Some(target) = self.resolve(segs, 0)
                    && target != *name
                {
                    edges.insert(target);
                }
            }
            graph.insert(name.clone(), edges);
        }
        graph
    }
}

impl Module {
    /// Segments from the crate root for a path written in this module, or
    /// `None` when it starts in another crate.
    fn absolute(&self, path: &str, names: &BTreeSet<ModPath>) -> Option<Vec<String>> {
        let mut segs = segments(path);
        let mut base = match segs.first().map(String::as_str) {
            Some("crate") => {
                segs.remove(0);
                Vec::new()
            }
            Some("super") => {
                let mut b = self.parent.clone();
                segs.remove(0);
                while segs.first().map(String::as_str) == Some("super") {
                    b.pop();
                    segs.remove(0);
                }
                b
            }
            Some("self") => {
                segs.remove(0);
                self.here.clone()
            }
            // A child module named without `self::`.
            Some(first) if names.contains(&self.child(first).join("::")) => self.here.clone(),
            _ => return None,
        };
        base.extend(segs);
        Some(base)
    }

    fn child(&self, name: &str) -> Vec<String> {
        let mut c = self.here.clone();
        c.push(name.to_string());
        c
    }

    /// `use` items (a line that starts with `use` or `pub… use`), braces
    /// expanded.
    fn read_uses(&mut self, names: &BTreeSet<ModPath>) {
        let text = self.text.clone();
        let mut rest_of_code = String::new();
        for item in text.split_inclusive(';') {
            let Some((reexport, start)) = item.lines().rev().find_map(|line| {
                let t = line.trim_start();
                match t.strip_prefix("pub") {
                    Some(r) => r
                        .trim_start_matches(|c: char| c != ' ' && c != '\t')
                        .trim_start()
                        .strip_prefix("use ")
                        .map(|u| (true, u)),
                    None => t.strip_prefix("use ").map(|u| (false, u)),
                }
            }) else {
                rest_of_code.push_str(item);
                continue;
            };
            let at = item.rfind(start).unwrap_or(0);
            rest_of_code.push_str(&item[..at]);
            let tree = item[at..].trim_end_matches(';');
            for (path, name) in expand(tree) {
                let target = self.absolute(&path, names);
                self.bindings.push((name, Binding { target, reexport }));
            }
        }
        // Code paths are read from what is left.
        self.text_without_uses = rest_of_code;
    }

    /// Paths written in the code: `crate::…`, `super::…` and `child::…` for
    /// this module's own children.
    fn read_code_paths(&mut self, names: &BTreeSet<ModPath>) {
        let mut starts: Vec<String> = vec!["crate::".into(), "super::".into()];
        for n in names {
            let segs = segments(n);
            if segs.len() == self.here.len() + 1 && segs.starts_with(&self.here) {
                starts.push(format!("{}::", segs.last().unwrap()));
            }
        }
        let text = &self.text_without_uses;
        let mut found = Vec::new();
        for start in &starts {
            for (i, _) in text.match_indices(start.as_str()) {
                // Part of a longer path or name (`a::super::`, `xcrate::`).
                if i > 0 && text[..i].ends_with(|c: char| is_ident(c) || c == ':') {
                    continue;
                }
                let end = text[i..]
                    .find(|c: char| !(is_ident(c) || c == ':'))
                    .map_or(text.len(), |e| i + e);
                found.push(text[i..end].trim_end_matches(':').to_string());
            }
        }
        self.paths = found
            .iter()
            .filter_map(|p| self.absolute(p, names))
            .collect();
    }
}

/// The circles of a graph (its strongly connected components of more
/// than one module), each as the modules in it.
pub fn circles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}
