//! Every dependency a workspace crate declares is used by it
//! (docs/architecture.md, "Crates"): a normal dependency by its library or
//! binaries (`src/`), a build dependency by `build.rs`, a dev-dependency by
//! anything of the package (`src/`'s test modules, `tests/`, `benches/`,
//! `examples/`). An unused dependency is build time, supply chain and a
//! false line in the crate graph.

use std::path::{Path, PathBuf};

/// Dependencies no line of the package names, declared for a reason the
/// check cannot see (a feature of a crate another dependency brings, a
/// name a derive macro's output uses): (package, dependency, why).
pub const FEATURE_ONLY: [(&str, &str, &str); 2] = [
    (
        "ipsetmgr-api",
        "serde_json",
        // The code `#[derive(CustomResource)]` generates names
        // `::serde_json`; no line of ours does.
        "named by kube's CustomResource derive",
    ),
    (
        "ipsetmgr-envtest",
        "k8s-openapi",
        // kube needs one Kubernetes version feature of k8s-openapi enabled by
        // its user; the workspace's k8s-openapi entry enables `latest`.
        "selects k8s-openapi's Kubernetes version for kube",
    ),
];

/// Which files of a package a dependency of this kind must be named in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Dev,
    Build,
}

impl Kind {
    pub fn of(kind: Option<&str>) -> Kind {
        match kind {
            Some("dev") => Kind::Dev,
            Some("build") => Kind::Build,
            _ => Kind::Normal,
        }
    }

    /// The package's files this kind may be used from, relative to its
    /// directory.
    fn places(self) -> &'static [&'static str] {
        match self {
            Kind::Normal => &["src"],
            Kind::Build => &["build.rs"],
            Kind::Dev => &["src", "tests", "benches", "examples", "build.rs"],
        }
    }
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            rust_files(&entry.unwrap().path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The text of the package's Rust files where `kind` may be used.
pub fn sources(dir: &Path, kind: Kind) -> String {
    let mut files = Vec::new();
    for place in kind.places() {
        rust_files(&dir.join(place), &mut files);
    }
    // Comments (doc examples included) do not use a crate.
    let mut text = String::new();
    for f in files {
        for line in std::fs::read_to_string(f).unwrap().lines() {
            if !line.trim_start().starts_with("//") {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}

/// Does `text` name crate `name` (as code calls it: dashes are
/// underscores) as `name::`, `use name` or `extern crate name`?
pub fn names_crate(text: &str, name: &str) -> bool {
    let name = name.replace('-', "_");
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let whole = |i: usize, len: usize| {
        !text[..i].ends_with(|c: char| ident(c) || c == ':') && !text[i + len..].starts_with(ident)
    };
    let path = format!("{name}::");
    let found = |needle: &str, word: &str| {
        text.match_indices(needle)
            .any(|(i, _)| whole(i + needle.len() - word.len(), word.len()))
    };
    text.match_indices(&path).any(|(i, _)| whole(i, name.len()))
        || found(&format!("use {name}"), &name)
        || found(&format!("extern crate {name}"), &name)
}
