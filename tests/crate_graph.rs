//! The workspace's shape, checked rather than only described
//! (docs/architecture.md, "Crates"):
//!
//! - the pure crates (ipset, sets, api, policy) never reach tokio or a
//!   kube client through their normal dependencies, however indirectly;
//! - nothing above the node (api, policy, cluster, feeds, controller)
//!   reaches a kernel crate (dataplane, nft, bpf) through its normal
//!   dependencies, however indirectly;
//! - the agent and the controller never depend on each other;
//! - nothing depends on the binary's package;
//! - every declared dependency is named by the package's code
//!   (`crate_graph/deps.rs`);
//! - outside the kernel crates, every crate root forbids `unsafe` and no
//!   test, bench or example contains it;
//! - within each crate, no two modules import each other, directly or
//!   around a circle, also when they name each other's items through
//!   re-exports (`crate_graph/modules.rs`);
//! - no production code returns `Result<_, String>` outside an allow-list
//!   of clap value parsers (`crate_graph/text_errors.rs`).
//!
//! The crate graph is read from `cargo metadata`, with each dependency's
//! features followed as cargo enables them for that crate alone (the
//! workspace-wide resolve unifies features, so kube there always has its
//! client). The module graph is read from each crate's `use` declarations
//! and `crate::`/`super::`/child paths, each followed to the module that
//! defines what it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[path = "crate_graph/deps.rs"]
mod deps;
#[path = "crate_graph/modules.rs"]
mod modules;
#[path = "crate_graph/text_errors.rs"]
mod text_errors;

use modules::{Crate, circles};

/// Crates that must stay free of an async runtime and of a cluster client.
const PURE: [&str; 4] = [
    "ipsetmgr-ipset",
    "ipsetmgr-api",
    "ipsetmgr-policy",
    "ipsetmgr-sets",
];
/// What the pure crates must never reach.
const FORBIDDEN: [&str; 2] = ["tokio", "kube-client"];
/// The binary's package.
const BINARY: &str = "ipsetmgr";

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn host() -> String {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("running rustc -vV");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host")
}

/// `cargo metadata` of the workspace, for this host's platform.
fn metadata() -> &'static Value {
    static META: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    META.get_or_init(|| {
        let out = cargo()
            .args(["metadata", "--format-version", "1", "--locked"])
            .args(["--filter-platform", &host()])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("running cargo metadata");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
    })
}

/// One declared dependency of a package.
struct Dep {
    /// The package it names.
    package: String,
    /// The key features name it by (its rename, else the package name).
    key: String,
    normal: bool,
    optional: bool,
    default_features: bool,
    features: Vec<String>,
}

struct Package {
    name: String,
    deps: Vec<Dep>,
    features: BTreeMap<String, Vec<String>>,
    /// The resolved packages of each dependency's package name.
    resolved: BTreeMap<String, Vec<String>>,
}

struct Graph {
    packages: BTreeMap<String, Package>,
    workspace: Vec<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn graph() -> Graph {
    let meta = metadata();
    let mut packages = BTreeMap::new();
    let names: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut resolved: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let id = node["id"].as_str().unwrap().to_string();
        let entry = resolved.entry(id).or_default();
        for d in node["deps"].as_array().unwrap() {
            let pkg = d["pkg"].as_str().unwrap().to_string();
            entry.entry(names[&pkg].clone()).or_default().push(pkg);
        }
    }
    for p in meta["packages"].as_array().unwrap() {
        let id = p["id"].as_str().unwrap().to_string();
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let package = d["name"].as_str().unwrap().to_string();
                Dep {
                    key: d["rename"].as_str().unwrap_or(&package).to_string(),
                    package,
                    normal: d["kind"].is_null(),
                    optional: d["optional"].as_bool().unwrap_or(false),
                    default_features: d["uses_default_features"].as_bool().unwrap_or(true),
                    features: strings(&d["features"]),
                }
            })
            .collect();
        let features = p["features"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), strings(v)))
            .collect();
        packages.insert(
            id.clone(),
            Package {
                name: p["name"].as_str().unwrap().to_string(),
                deps,
                features,
                resolved: resolved.remove(&id).unwrap_or_default(),
            },
        );
    }
    Graph {
        packages,
        workspace: strings(&meta["workspace_members"]),
    }
}

impl Graph {
    fn id_of(&self, name: &str) -> Option<&String> {
        self.workspace
            .iter()
            .find(|id| self.packages[*id].name == name)
    }

    /// Every package `root` reaches through normal dependencies, with the
    /// features cargo would enable building `root` alone (a small
    /// reimplementation of its feature resolver: `dep:x`, `x/f`, `x?/f`,
    /// implicit features of optional dependencies, default features).
    fn normal_closure(&self, root: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut enabled: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut active_deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        enabled.insert(root.to_string(), BTreeSet::new());
        loop {
            let before = (enabled.clone(), active_deps.clone());
            for id in before.0.keys() {
                let pkg = &self.packages[id];
                // The package's features, closed over its feature table.
                let mut feats = enabled[id].clone();
                let mut deps_on = active_deps.get(id).cloned().unwrap_or_default();
                let mut dep_feats: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                let mut weak: Vec<(String, String)> = Vec::new();
                let mut todo: Vec<String> = feats.iter().cloned().collect();
                while let Some(f) = todo.pop() {
                    for item in pkg.features.get(&f).into_iter().flatten() {
                        if let Some(dep) = item.strip_prefix("dep:") {
                            deps_on.insert(dep.to_string());
                        } else if let Some((dep, df)) = item.split_once('/') {
                            if let Some(dep) = dep.strip_suffix('?') {
                                weak.push((dep.to_string(), df.to_string()));
                            } else {
                                deps_on.insert(dep.to_string());
                                // An optional dependency's implicit feature.
                                if pkg.features.contains_key(dep) && feats.insert(dep.to_string()) {
                                    todo.push(dep.to_string());
                                }
                                dep_feats
                                    .entry(dep.to_string())
                                    .or_default()
                                    .insert(df.to_string());
                            }
                        } else if feats.insert(item.clone()) {
                            todo.push(item.clone());
                        }
                    }
                    // `f` may itself be an optional dependency's name.
                    if pkg.deps.iter().any(|d| d.optional && d.key == f) {
                        deps_on.insert(f.clone());
                    }
                }
                for (dep, df) in weak {
                    if deps_on.contains(&dep) {
                        dep_feats.entry(dep).or_default().insert(df);
                    }
                }
                for d in pkg.deps.iter().filter(|d| d.normal) {
                    if d.optional && !deps_on.contains(&d.key) {
                        continue;
                    }
                    let mut want: BTreeSet<String> = d.features.iter().cloned().collect();
                    if d.default_features {
                        want.insert("default".into());
                    }
                    want.extend(dep_feats.get(&d.key).cloned().unwrap_or_default());
                    for target in pkg.resolved.get(&d.package).into_iter().flatten() {
                        let have = enabled.entry(target.clone()).or_default();
                        let known = &self.packages[target].features;
                        have.extend(
                            want.iter()
                                .filter(|f| known.contains_key(*f) || *f != "default")
                                .cloned(),
                        );
                    }
                }
                enabled.get_mut(id).unwrap().extend(feats);
                active_deps.insert(id.clone(), deps_on);
            }
            if (enabled.clone(), active_deps.clone()) == before {
                break;
            }
        }
        enabled
            .into_iter()
            .map(|(id, f)| (self.packages[&id].name.clone(), f))
            .collect()
    }

    /// Every workspace package `root` reaches by any kind of dependency.
    fn any_closure(&self, root: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![root.to_string()];
        while let Some(id) = todo.pop() {
            for targets in self.packages[&id].resolved.values() {
                for t in targets {
                    if self.workspace.contains(t) && seen.insert(t.clone()) {
                        todo.push(t.clone());
                    }
                }
            }
        }
        seen.into_iter()
            .map(|id| self.packages[&id].name.clone())
            .collect()
    }
}

/// Why `closure` breaks the pure crates' rule, if it does.
fn forbidden_in(closure: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found: Vec<String> = FORBIDDEN
        .iter()
        .filter(|f| closure.contains_key(**f))
        .map(|f| f.to_string())
        .collect();
    if closure.get("kube").is_some_and(|f| f.contains("client")) {
        found.push("kube with its client feature".into());
    }
    found
}

#[test]
fn the_pure_crates_never_reach_tokio_or_a_kube_client() {
    let g = graph();
    // The check itself works: the binary does reach both.
    let binary = g.normal_closure(g.id_of(BINARY).unwrap());
    assert_eq!(
        forbidden_in(&binary).len(),
        3,
        "the binary should reach tokio, kube-client and kube's client: {:?}",
        forbidden_in(&binary)
    );
    let mut checked = 0;
    for name in PURE {
        let Some(id) = g.id_of(name) else {
            panic!("{name} is not a workspace member")
        };
        checked += 1;
        let found = forbidden_in(&g.normal_closure(id));
        assert!(found.is_empty(), "{name} depends on {found:?}");
    }
    assert_eq!(checked, PURE.len());
}

/// The crates above the node: they describe, compile, fetch and decide,
/// and never touch a kernel.
const ABOVE_THE_NODE: [&str; 5] = [
    "ipsetmgr-api",
    "ipsetmgr-policy",
    "ipsetmgr-cluster",
    "ipsetmgr-feeds",
    "ipsetmgr-controller",
];
/// The kernel crates (netlink sockets, namespaces, bpf(2), `unsafe`).
const KERNEL: [&str; 3] = ["ipsetmgr-dataplane", "ipsetmgr-nft", "ipsetmgr-bpf"];

/// The kernel crates `closure` reaches.
fn kernels_in(closure: &BTreeMap<String, BTreeSet<String>>) -> Vec<&'static str> {
    KERNEL
        .into_iter()
        .filter(|k| closure.contains_key(*k))
        .collect()
}

#[test]
fn nothing_above_the_node_reaches_a_kernel_crate() {
    let g = graph();
    // The check itself works: the agent does reach the kernels it drives.
    let agent = g.normal_closure(g.id_of("ipsetmgr-agent").unwrap());
    assert_eq!(
        kernels_in(&agent),
        ["ipsetmgr-dataplane", "ipsetmgr-nft", "ipsetmgr-bpf"],
        "the agent should reach every kernel crate"
    );
    let mut found = Vec::new();
    for name in ABOVE_THE_NODE {
        let Some(id) = g.id_of(name) else {
            panic!("{name} is not a workspace member")
        };
        let kernels = kernels_in(&g.normal_closure(id));
        if !kernels.is_empty() {
            found.push(format!("{name} depends on {kernels:?}"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_agent_and_the_controller_never_depend_on_each_other() {
    let g = graph();
    for (a, b) in [
        ("ipsetmgr-agent", "ipsetmgr-controller"),
        ("ipsetmgr-controller", "ipsetmgr-agent"),
    ] {
        let Some(id) = g.id_of(a) else { continue };
        assert!(
            !g.any_closure(id).contains(b),
            "{a} depends (perhaps indirectly) on {b}"
        );
    }
}

#[test]
fn nothing_depends_on_the_binary() {
    let g = graph();
    for id in &g.workspace {
        let pkg = &g.packages[id];
        assert!(
            !pkg.deps.iter().any(|d| d.package == BINARY),
            "{} depends on the binary's package",
            pkg.name
        );
    }
}

// ---- the module graph of each crate (crate_graph/modules.rs) ----

/// The source directory of every workspace crate (its lib, else its bin).
fn crate_sources() -> Vec<(String, PathBuf)> {
    let meta = metadata();
    let members = strings(&meta["workspace_members"]);
    let mut out = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        if !members.iter().any(|m| m == p["id"].as_str().unwrap()) {
            continue;
        }
        let targets = p["targets"].as_array().unwrap();
        let root = ["lib", "bin"].iter().find_map(|kind| {
            targets
                .iter()
                .find(|t| strings(&t["kind"]).iter().any(|k| k == kind))
        });
        if let Some(t) = root {
            let file = PathBuf::from(t["src_path"].as_str().unwrap());
            out.push((
                p["name"].as_str().unwrap().to_string(),
                file.parent().unwrap().to_path_buf(),
            ));
        }
    }
    out
}

#[test]
fn no_module_imports_itself_around_a_circle() {
    let mut found = Vec::new();
    for (name, src) in crate_sources() {
        for circle in circles(&Crate::read(&src).graph()) {
            found.push(format!("{name}: {}", circle.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// A fake crate written to a temporary directory: (file, text) pairs.
fn fake_crate(files: &[(&str, &str)]) -> (tempfile::TempDir, BTreeMap<String, BTreeSet<String>>) {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in files {
        let path = dir.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let graph = Crate::read(dir.path()).graph();
    (dir, graph)
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_circle_check_finds_a_circle() {
    let (_dir, graph) = fake_crate(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::{b::B, c};\n"),
        ("b.rs", "pub struct B;\nfn f() { super::a::g(); }\n"),
        // c imports a only in its tests and comments: no edge.
        (
            "c.rs",
            "// crate::a::x\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
        ),
    ]);
    assert_eq!(circles(&graph), vec![names(&["a", "b"])]);
    assert!(graph["c"].is_empty(), "{graph:?}");
}

/// The shape of the circle the ipset manager crate once had (batch and
/// report): each side names the other only through the crate root's
/// re-exports.
#[test]
fn the_circle_check_sees_through_re_exports_at_the_crate_root() {
    let (_dir, graph) = fake_crate(&[
        (
            "lib.rs",
            "mod batch;\nmod report;\npub use batch::Plan;\npub use report::{NotReplaced as Kept};\n",
        ),
        ("batch.rs", "pub enum Plan { A }\nfn f(_: crate::Kept) {}\n"),
        (
            "report.rs",
            "use super::Plan;\npub struct NotReplaced(Plan);\n",
        ),
    ]);
    assert_eq!(
        circles(&graph),
        vec![names(&["batch", "report"])],
        "{graph:?}"
    );
    // Re-exporting is not using: the root has no edge.
    assert!(graph[""].is_empty(), "{graph:?}");
}

/// Re-exports in a nested module, a glob re-export, and an item the
/// parent defines (a real edge to an ancestor) all count.
#[test]
fn the_circle_check_follows_nested_re_exports_and_ancestor_items() {
    let (_dir, graph) = fake_crate(&[
        ("lib.rs", "mod outer;\nmod other;\n"),
        (
            "outer/mod.rs",
            "mod inner;\nmod deep;\npub(crate) use self::inner::Thing;\npub use deep::*;\n\
             pub struct Parented;\nfn g() { inner::h(); }\n",
        ),
        (
            "outer/inner.rs",
            "pub struct Thing;\npub fn h() { let _ = super::Parented; }\n",
        ),
        ("outer/deep.rs", "pub fn deep_fn() {}\n"),
        ("other.rs", "use crate::outer::{Thing, deep_fn};\n"),
    ]);
    assert_eq!(
        graph["other"],
        BTreeSet::from(["outer::inner".to_string(), "outer::deep".to_string()]),
        "{graph:?}"
    );
    // outer calls inner, inner uses outer's own type: a circle.
    assert_eq!(circles(&graph), vec![names(&["outer", "outer::inner"])]);
}

// ---- every declared dependency is used (crate_graph/deps.rs) ----

#[test]
fn every_declared_dependency_is_used() {
    let meta = metadata();
    let members = strings(&meta["workspace_members"]);
    let mut unused = Vec::new();
    let mut allowed_seen = Vec::new();
    let mut checked = 0;
    for p in meta["packages"].as_array().unwrap() {
        if !members.iter().any(|m| m == p["id"].as_str().unwrap()) {
            continue;
        }
        let package = p["name"].as_str().unwrap();
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap());
        let dir = manifest.parent().unwrap();
        for d in p["dependencies"].as_array().unwrap() {
            let name = d["rename"].as_str().or(d["name"].as_str()).unwrap();
            let kind = deps::Kind::of(d["kind"].as_str());
            checked += 1;
            if deps::FEATURE_ONLY
                .iter()
                .any(|(p, n, _)| *p == package && *n == name)
            {
                allowed_seen.push((package, name));
                continue;
            }
            if !deps::names_crate(&deps::sources(dir, kind), name) {
                unused.push(format!("{package}: {kind:?} dependency {name}"));
            }
        }
    }
    assert!(checked > 50, "only {checked} dependencies read");
    // The allow-list holds nothing stale.
    for (p, n, _) in deps::FEATURE_ONLY {
        assert!(
            allowed_seen.contains(&(p, n)),
            "{p} no longer declares {n}: drop it from FEATURE_ONLY"
        );
    }
    assert!(
        unused.is_empty(),
        "dependencies no code of the package names:\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_dependency_check_sees_uses_and_not_lookalikes() {
    use deps::names_crate;
    assert!(names_crate("use serde_json::Value;", "serde-json"));
    assert!(names_crate("let x = kube::Client::new();", "kube"));
    assert!(names_crate("#[derive(thiserror::Error)]", "thiserror"));
    assert!(names_crate("use tokio;", "tokio"));
    assert!(names_crate("extern crate libc;", "libc"));
    assert!(names_crate("use foo::{a, b};", "foo"));
    // Another crate whose name ends or starts the same, a path segment.
    assert!(!names_crate("use kube_runtime::x;", "kube"));
    assert!(!names_crate("use my_kube::x;", "kube"));
    assert!(!names_crate("crate::kube::x()", "kube"));
    assert!(!names_crate("use tokio_rustls;", "tokio"));
    assert!(!names_crate("let json = 1;", "json-patch"));
}

// ---- `unsafe` only in the kernel crates ----

/// The crates that may contain `unsafe` (docs/architecture.md, "Crates").
const UNSAFE_ALLOWED: [&str; 3] = KERNEL;

/// Unsafe code as written, spelt so that this file does not contain it.
const UNSAFE_CODE: [&str; 3] = [
    concat!("unsafe", " {"),
    concat!("unsafe", " fn"),
    concat!("unsafe", " impl"),
];

/// Does a crate root forbid `unsafe` for its whole crate? (An inner
/// attribute at the top level of the file, not in a comment.)
fn forbids_unsafe(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .any(|l| l.replace(' ', "") == "#![forbid(unsafe_code)]")
}

#[test]
fn every_crate_root_outside_the_kernel_crates_forbids_unsafe() {
    let meta = metadata();
    let members = strings(&meta["workspace_members"]);
    let mut missing = Vec::new();
    let mut checked = 0;
    for p in meta["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        if !members.iter().any(|m| m == p["id"].as_str().unwrap()) || UNSAFE_ALLOWED.contains(&name)
        {
            continue;
        }
        for t in p["targets"].as_array().unwrap() {
            let kinds = strings(&t["kind"]);
            let file = t["src_path"].as_str().unwrap();
            let text = std::fs::read_to_string(file).unwrap();
            // The code that is built for use: libraries, binaries and build
            // scripts carry the attribute. Tests, benches and examples
            // simply contain no unsafe code (checked in the text).
            if kinds
                .iter()
                .any(|k| matches!(k.as_str(), "lib" | "bin" | "proc-macro" | "custom-build"))
            {
                checked += 1;
                if !forbids_unsafe(&text) {
                    missing.push(format!("{name}: {file} has no #![forbid(unsafe_code)]"));
                }
            } else if UNSAFE_CODE.iter().any(|u| text.contains(u)) {
                missing.push(format!("{name}: {file} contains unsafe code"));
            }
        }
    }
    assert!(checked >= 10, "only {checked} crate roots read");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_unsafe_check_reads_the_attribute_not_a_comment() {
    assert!(forbids_unsafe("//! Docs.\n\n#![forbid(unsafe_code)]\n"));
    assert!(!forbids_unsafe("// #![forbid(unsafe_code)]\n"));
    assert!(!forbids_unsafe("#![deny(unsafe_code)]\n"));
}

// ---- typed errors: no `Result<_, String>` (crate_graph/text_errors.rs) ----

/// Clap value parsers (`value_parser = f`): clap shows their text after
/// the flag. They may keep a String, though clap takes a typed error as
/// well (`ipsetmgr_policy::duration` does).
const CLAP_PARSERS: [&str; 9] = [
    "crates/node/src/side.rs: parse_table_family", // --nft-family
    "crates/node/src/side.rs: parse_table_name",   // --nft-table
    "crates/feeds/src/egress.rs: parse",           // Cidr::parse, --feed-allow/deny-cidr
    "src/args.rs: parse_backend_list",             // --backend
    "src/args.rs: parse_slice_type",               // slice --type
    "src/args.rs: parse_family",                   // slice --family
    "src/args.rs: parse_label",                    // --node-label
    "src/args.rs: parse_members_file",             // --members
    "src/commands/slice/mod.rs: parse_policy_name", // slice --policy
];

/// Not clap parsers, and not converted yet: each in code this change
/// could not touch. Empty this list; never add to it.
const NOT_YET_TYPED: [&str; 2] = [
    // File mode (src/files/**, worked on elsewhere): the fetch thread's
    // setup error.
    "crates/filemode/src/files/sources.rs: fetch_side",
    // nft's text listing reader; outside issue 31's list.
    "crates/nft/src/cli/text.rs: set_flags",
];

fn text_error_hits(roots: &[PathBuf], base: &std::path::Path) -> Vec<String> {
    let mut files = Vec::new();
    for r in roots {
        text_errors::production_files(r, &mut files);
    }
    files.sort();
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(base).unwrap_or(&f).display().to_string();
        for name in text_errors::hits(&text) {
            found.push(format!("{rel}: {name}"));
        }
    }
    found
}

#[test]
fn no_production_code_returns_a_text_error() {
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let roots: Vec<PathBuf> = crate_sources().into_iter().map(|(_, src)| src).collect();
    assert!(roots.len() >= 10, "only {} crates read", roots.len());
    let found = text_error_hits(&roots, &base);
    let unlisted: Vec<&String> = found
        .iter()
        .filter(|h| !CLAP_PARSERS.contains(&h.as_str()) && !NOT_YET_TYPED.contains(&h.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "Result<_, String> in production code (use a thiserror type; only clap value parsers may keep text):\n{}",
        unlisted
            .iter()
            .map(|h| h.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The lists stay true: every entry still names a hit.
    for listed in CLAP_PARSERS.iter().chain(&NOT_YET_TYPED) {
        assert!(
            found.iter().any(|h| h == listed),
            "{listed} is listed but no longer a hit"
        );
    }
}

#[test]
fn the_text_error_check_sees_nested_and_split_signatures_not_tests_or_comments() {
    let text = "fn a() -> Result<Vec<Option<u8>>, String> { todo!() }\n\
        fn b(\n    x: u8,\n) -> Result<\n    (u8, u8),\n    String,\n> { todo!() }\n\
        struct S { f: Option<Result<u8, String>> }\n\
        fn c() -> Result<String, Error> { todo!() }\n\
        fn d() -> ParseResult<u8, String> { todo!() }\n\
        // fn e() -> Result<u8, String>\n\
        #[cfg(test)]\nmod tests {\n    fn f() -> Result<u8, String> { todo!() }\n}\n\
        fn g() -> io::Result<u8> { todo!() }\n";
    assert_eq!(text_errors::hits(text), ["a", "b", "b"]);
}
