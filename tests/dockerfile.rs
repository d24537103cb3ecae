//! The image as the Dockerfile builds it, checked on the parsed Dockerfile
//! (the `parse-dockerfile` crate: stages, instructions, exec-form arrays,
//! flags) rather than on its text, and the cargo profile it builds with
//! (Cargo.toml parsed by the `toml` crate).
//!
//! What is pinned here is the contract with the pod specs and the reasons in
//! docs/image.md: the agent ENTRYPOINT and the binary's path (the controller
//! Deployment runs `/usr/local/bin/ipsetmgr controller`; tests/manifests/
//! checks that side), a stripped binary built with `--locked` and cached by
//! cargo-chef under the same profile, a runtime stage without a shell that
//! still has `ipset` for the cli backend and `nft` for the nft-cli backend,
//! each with exactly the libraries it links, OCI labels from build
//! arguments, the four ports, and uid 0 with the reason next to it.
//!
//! RUN lines are shell: they are split here into simple commands (on `&&`,
//! `||`, `;`, `|`) and words, quotes removed. That is enough for the plain
//! commands this Dockerfile uses; a RUN that needs more (variables, subshells)
//! would need these checks to change with it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use parse_dockerfile::{Command, Dockerfile, Instruction, Source, Stage};

/// Where the binary is in the image: the DaemonSet relies on the ENTRYPOINT,
/// the controller Deployment names this path as its command.
const BINARY: &str = "/usr/local/bin/ipsetmgr";
/// The builder's output, which the runtime stage copies.
const BUILT: &str = "/out/ipsetmgr";
/// The cargo profile of the shipped binary.
const PROFILE: &str = "dist";
/// agent health, agent metrics, controller metrics, controller health.
const PORTS: [u16; 4] = [9476, 9477, 9478, 9479];

/// A tool a backend runs, copied into the runtime from a Debian stage of its
/// own (the runtime has no package manager).
struct Tool {
    /// The stage's name.
    stage: &'static str,
    /// What apt installs.
    package: &'static str,
    /// The packages whose files `dpkg -L` lists: the tool's and its
    /// libraries'.
    packages: &'static [&'static str],
    /// The tool's path.
    path: &'static str,
    /// The shared libraries it links besides glibc, as `ldd` names them on
    /// bookworm (directly or through each other).
    links: &'static [&'static str],
}

const TOOLS: [Tool; 2] = [
    Tool {
        stage: "ipset",
        package: "ipset",
        packages: &["ipset", "libipset13", "libmnl0"],
        path: "/usr/sbin/ipset",
        links: &["libipset.so.13", "libmnl.so.0"],
    },
    Tool {
        stage: "nft",
        package: "nftables",
        packages: &[
            "nftables",
            "libnftables1",
            "libedit2",
            "libmnl0",
            "libnftnl11",
            "libxtables12",
            "libjansson4",
            "libgmp10",
            "libtinfo6",
            "libbsd0",
            "libmd0",
        ],
        path: "/usr/sbin/nft",
        links: &[
            "libnftables.so.1",
            "libedit.so.2",
            "libmnl.so.0",
            "libnftnl.so.11",
            "libxtables.so.12",
            "libjansson.so.4",
            "libgmp.so.10",
            "libtinfo.so.6",
            "libbsd.so.0",
            "libmd.so.0",
        ],
    },
];

/// `dpkg -L` of each package of [`TOOLS`] on Debian bookworm amd64, as
/// `== PACKAGE` and then its lines (recorded with `for p in ...; do echo
/// "== $p"; dpkg -L $p; done`).
fn dpkg_listing() -> BTreeMap<String, Vec<String>> {
    let text = read("tests/dockerfile/dpkg-L-bookworm-amd64.txt");
    let mut listing = BTreeMap::new();
    let mut current: Option<&mut Vec<String>> = None;
    for line in text.lines() {
        if let Some(package) = line.strip_prefix("== ") {
            current = Some(listing.entry(package.to_string()).or_default());
        } else {
            current
                .as_mut()
                .expect("the listing starts with `== PACKAGE`")
                .push(line.to_string());
        }
    }
    listing
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn parse(text: &str) -> Dockerfile<'_> {
    parse_dockerfile::parse(text).unwrap_or_else(|e| panic!("Dockerfile does not parse: {e}"))
}

fn stage<'a, 'b>(d: &'b Dockerfile<'a>, name: &str) -> Stage<'a, 'b> {
    d.stage(name)
        .unwrap_or_else(|| panic!("no stage named {name:?}"))
}

/// The stage the image is: the last one.
fn runtime<'a, 'b>(d: &'b Dockerfile<'a>) -> Stage<'a, 'b> {
    d.stages().last().expect("no stage")
}

fn stage_name(s: &Stage<'_, '_>) -> String {
    s.from
        .as_
        .as_ref()
        .map_or_else(|| "(unnamed)".to_string(), |(_, n)| n.value.to_string())
}

fn flag<'a>(flags: &'a [parse_dockerfile::Flag<'_>], name: &str) -> Option<&'a str> {
    flags
        .iter()
        .find(|f| f.name.value == name)
        .map(|f| f.value.as_ref().map_or("", |v| &v.value))
}

/// The simple commands of a shell-form RUN, each as its words. Line
/// continuations are joined first; quotes are removed from the words.
fn shell_commands(script: &str) -> Vec<Vec<String>> {
    let joined = script.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut commands = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = joined.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => {
                commands.last_mut().unwrap().extend(word.take());
            }
            (None, '&' | '|' | ';') => {
                commands.last_mut().unwrap().extend(word.take());
                if matches!(c, '&' | '|') && chars.peek() == Some(&c) {
                    chars.next();
                }
                commands.push(Vec::new());
            }
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "unterminated quote in RUN {script:?}");
    commands.last_mut().unwrap().extend(word);
    commands.retain(|c| !c.is_empty());
    commands
}

/// Every simple command of every RUN in a stage, with the instruction's index
/// in the stage.
fn runs(s: &Stage<'_, '_>) -> Vec<(usize, Vec<String>)> {
    s.instructions
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| match ins {
            Instruction::Run(run) => Some((i, run)),
            _ => None,
        })
        .flat_map(|(i, run)| {
            let Command::Shell(script) = &run.arguments else {
                panic!("{}: exec-form RUN not expected", stage_name(s))
            };
            shell_commands(script.value)
                .into_iter()
                .map(move |c| (i, c))
        })
        .collect()
}

/// The one command of a stage whose words start with `prefix`.
fn command(s: &Stage<'_, '_>, prefix: &[&str]) -> (usize, Vec<String>) {
    let found: Vec<_> = runs(s)
        .into_iter()
        .filter(|(_, words)| words.len() >= prefix.len() && words[..prefix.len()] == *prefix)
        .collect();
    match <[_; 1]>::try_from(found) {
        Ok([one]) => one,
        Err(found) => panic!(
            "stage {}: expected one `{}` command, found {found:?}",
            stage_name(s),
            prefix.join(" ")
        ),
    }
}

/// The value of `--name VALUE` or `--name=VALUE` in a command's words.
fn option<'w>(words: &'w [String], name: &str) -> Option<&'w str> {
    let eq = format!("{name}=");
    words.iter().enumerate().find_map(|(i, w)| {
        if w == name {
            words.get(i + 1).map(String::as_str)
        } else {
            w.strip_prefix(&eq)
        }
    })
}

fn has(words: &[String], word: &str) -> bool {
    words.iter().any(|w| w == word)
}

fn copies<'x, 'a, 'b>(
    s: &'x Stage<'a, 'b>,
) -> impl Iterator<Item = (usize, &'b parse_dockerfile::CopyInstruction<'a>)> + 'x {
    s.instructions
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| match ins {
            Instruction::Copy(c) => Some((i, c)),
            _ => None,
        })
}

fn copy_sources(c: &parse_dockerfile::CopyInstruction<'_>) -> Vec<String> {
    c.src
        .iter()
        .map(|s| match s {
            Source::Path(p) => p.value.to_string(),
            other => panic!("COPY of a here-document not expected: {other:?}"),
        })
        .collect()
}

/// `key=value` pairs of a LABEL, values unquoted (double quotes, as the
/// Dockerfile writes them; a backslash-newline is a continuation).
fn label_pairs(args: &str) -> BTreeMap<String, String> {
    let joined = args.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut pairs = BTreeMap::new();
    let mut rest = joined.trim_start();
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once('=')
            .unwrap_or_else(|| panic!("LABEL: no `=` in {rest:?}"));
        let value;
        if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted
                .find('"')
                .unwrap_or_else(|| panic!("LABEL {key}: unterminated quote"));
            value = &quoted[..end];
            rest = quoted[end + 1..].trim_start();
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            value = &after[..end];
            rest = after[end..].trim_start();
        }
        let old = pairs.insert(key.to_string(), value.to_string());
        assert!(old.is_none(), "LABEL {key} set twice");
    }
    pairs
}

/// `NAME=default` or `NAME` of an ARG.
fn arg_of(args: &str) -> (String, Option<String>) {
    match args.trim().split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.trim_matches('"').to_string())),
        None => (args.trim().to_string(), None),
    }
}

/// `$NAME` or `${NAME}`: the ARG a value is taken from.
fn arg_reference(value: &str) -> Option<&str> {
    value
        .strip_prefix("${")
        .and_then(|v| v.strip_suffix('}'))
        .or_else(|| value.strip_prefix('$'))
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

fn cargo_toml() -> toml::Table {
    read("Cargo.toml")
        .parse()
        .unwrap_or_else(|e| panic!("Cargo.toml: {e}"))
}

#[test]
fn the_image_runs_the_agent_binary() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let rt = runtime(&d);
    let entrypoints: Vec<_> = rt
        .instructions
        .iter()
        .filter_map(|i| match i {
            Instruction::Entrypoint(e) => Some(e),
            _ => None,
        })
        .collect();
    let [entrypoint] = entrypoints[..] else {
        panic!("the runtime stage needs exactly one ENTRYPOINT, has {entrypoints:?}")
    };
    // Exec form: the shell form would need /bin/sh, and would not pass the
    // container's arguments (the controller's `args`) to the binary.
    let Command::Exec(argv) = &entrypoint.arguments else {
        panic!("ENTRYPOINT must be in exec form (a JSON array)")
    };
    let argv: Vec<&str> = argv.value.iter().map(|a| &*a.value).collect();
    assert_eq!(argv, [BINARY, "agent"], "the DaemonSet relies on this");
    // A CMD would be appended to `ipsetmgr agent` as arguments.
    assert!(
        !rt.instructions
            .iter()
            .any(|i| matches!(i, Instruction::Cmd(_))),
        "no CMD in the runtime stage"
    );
}

#[test]
fn the_binary_is_the_builders() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let rt = runtime(&d);
    let binary: Vec<_> = copies(&rt)
        .filter(|(_, c)| c.dest.value == BINARY)
        .collect();
    let [(_, copy)] = binary[..] else {
        panic!(
            "one COPY to {BINARY} in the runtime stage, found {}",
            binary.len()
        )
    };
    assert_eq!(flag(&copy.options, "from"), Some("builder"), "COPY --from");
    assert_eq!(copy_sources(copy), [BUILT]);
    // ... and the builder puts the binary of the dist profile there.
    let builder = stage(&d, "builder");
    let (_, install) = command(&builder, &["install"]);
    assert_eq!(
        install[install.len() - 2..],
        [format!("target/{PROFILE}/ipsetmgr"), BUILT.to_string()],
        "the builder installs the {PROFILE} binary as {BUILT}: {install:?}"
    );
    assert_eq!(option(&install, "-m"), Some("0755"), "{install:?}");
}

#[test]
fn the_builder_builds_the_stripped_profile_locked() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let builder = stage(&d, "builder");
    let (build_at, build) = command(&builder, &["cargo", "build"]);
    assert_eq!(option(&build, "--profile"), Some(PROFILE), "{build:?}");
    assert!(
        !has(&build, "--release") && !has(&build, "-r"),
        "--release is the profile with debug info: {build:?}"
    );
    assert!(has(&build, "--locked"), "Cargo.lock decides: {build:?}");
    assert_eq!(option(&build, "--bin"), Some("ipsetmgr"), "{build:?}");

    // cargo-chef: the recipe from the planner, the dependencies cooked with
    // the same profile and flags before the sources come in.
    let planner = stage(&d, "planner");
    let (_, prepare) = command(&planner, &["cargo", "chef", "prepare"]);
    let recipe = option(&prepare, "--recipe-path").expect("prepare --recipe-path");
    let (cook_at, cook) = command(&builder, &["cargo", "chef", "cook"]);
    assert_eq!(
        option(&cook, "--profile"),
        option(&build, "--profile"),
        "cook with the build's profile, or `cargo build` compiles every dependency again: {cook:?}"
    );
    assert!(!has(&cook, "--release"), "{cook:?}");
    assert!(has(&cook, "--locked"), "{cook:?}");
    assert_eq!(option(&cook, "--bin"), Some("ipsetmgr"), "{cook:?}");
    assert_eq!(option(&cook, "--recipe-path"), Some(recipe), "{cook:?}");
    let recipe_copy: Vec<_> = copies(&builder)
        .filter(|(_, c)| flag(&c.options, "from") == Some("planner"))
        .collect();
    let [(recipe_at, _)] = recipe_copy[..] else {
        panic!("the builder copies the recipe from the planner once")
    };
    let sources: Vec<usize> = copies(&builder)
        .filter(|(_, c)| copy_sources(c) == ["."])
        .map(|(i, _)| i)
        .collect();
    let [sources_at] = sources[..] else {
        panic!("the builder copies the sources once (COPY . .)")
    };
    assert!(
        recipe_at < cook_at && cook_at < sources_at && sources_at < build_at,
        "recipe, cook, sources, build: in that order (the cook layer is cached \
         until a manifest changes), got {recipe_at}, {cook_at}, {sources_at}, {build_at}"
    );
    // The image is built from the repository as it is, without target/ or .git.
    let ignore: BTreeSet<String> = read(".dockerignore").lines().map(str::to_string).collect();
    for dir in ["target", ".git"] {
        assert!(ignore.contains(dir), ".dockerignore lacks {dir}");
    }
}

#[test]
fn the_runtime_has_no_shell_and_the_ipset_and_nft_tools() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let rt = runtime(&d);
    let base = &rt.from.image.value;
    assert!(
        base.starts_with("gcr.io/distroless/cc-"),
        "runtime base {base}: distroless cc (glibc and libgcc_s, no shell)"
    );
    // distroless's :debug tags add a busybox shell.
    assert!(!base.contains("debug"), "runtime base {base}");
    for i in rt.instructions {
        assert!(
            !matches!(i, Instruction::Run(_) | Instruction::Shell(_)),
            "the runtime stage has no shell to RUN with: {i:?}"
        );
    }

    // ipset, nft and their libraries come from Debian stages of the same
    // release as the runtime's base (their glibc), which is also the
    // builder's.
    let release = base
        .rsplit_once("-debian")
        .map(|(_, n)| n)
        .unwrap_or_else(|| panic!("no Debian release in {base}"));
    let codename = match release {
        "12" => "bookworm",
        "13" => "trixie",
        other => panic!("unknown Debian release {other}"),
    };
    assert_eq!(
        stage(&d, "chef").from.image.value,
        format!("rust:1-{codename}"),
        "the binary links the glibc of the runtime's release"
    );
    for tool in &TOOLS {
        let s = stage(&d, tool.stage);
        assert_eq!(s.from.image.value, format!("debian:{codename}-slim"));
        let (_, install) = command(&s, &["apt-get", "install"]);
        assert!(has(&install, tool.package), "{install:?}");
        assert!(has(&install, "--no-install-recommends"), "{install:?}");
        let (_, files) = command(&s, &["dpkg", "-L"]);
        for package in tool.packages {
            assert!(
                has(&files, package),
                "the {package} files are copied: {files:?}"
            );
        }
        let copied: Vec<_> = copies(&rt)
            .filter(|(_, c)| flag(&c.options, "from") == Some(tool.stage))
            .collect();
        let [(_, copy)] = copied[..] else {
            panic!("the runtime copies the {} stage's files once", tool.stage)
        };
        assert_eq!(copy_sources(copy), ["/out/"]);
        assert_eq!(copy.dest.value, "/");
    }
}

/// Each tool stage's `dpkg -L ... | grep -E PATTERN` keeps, of what dpkg
/// lists on bookworm, exactly the tool and the libraries it links (each
/// soname link and the file it points to): no man page, no config, and no
/// library of those packages that the tool does not link (libtinfo6 ships
/// libtic too). Run through grep itself, so the pattern means what it
/// means in the build.
#[test]
fn the_tool_stages_keep_exactly_each_tool_and_its_libraries() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let listing = dpkg_listing();
    for tool in &TOOLS {
        let s = stage(&d, tool.stage);
        let (_, files) = command(&s, &["dpkg", "-L"]);
        let mut listed = Vec::new();
        for package in &files[2..] {
            let lines = listing
                .get(package)
                .unwrap_or_else(|| panic!("{}: no recorded listing of {package}", tool.stage));
            listed.extend(lines.iter().map(String::as_str));
        }
        let (_, grep) = command(&s, &["grep", "-E"]);
        let [_, _, pattern] = &grep[..] else {
            panic!("{}: `grep -E PATTERN`, got {grep:?}", tool.stage)
        };
        let mut child = std::process::Command::new("grep")
            .args(["-E", pattern])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run grep");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(listed.join("\n").as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
        let out = child.wait_with_output().expect("grep ran");
        let mut kept: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        kept.sort();
        let linked = |path: &str| {
            let file = path.rsplit('/').next().unwrap_or(path);
            tool.links
                .iter()
                .any(|l| file == *l || file.starts_with(&format!("{l}.")))
        };
        let mut want: Vec<String> = listed
            .iter()
            .filter(|p| **p == tool.path || linked(p))
            .map(|p| p.to_string())
            .collect();
        want.sort();
        assert_eq!(kept, want, "{}: pattern {pattern}", tool.stage);
        assert!(kept.iter().any(|p| p == tool.path), "{}", tool.stage);
        for l in tool.links {
            assert!(
                kept.iter().any(|p| p.ends_with(&format!("/{l}"))),
                "{}: {l} is not copied",
                tool.stage
            );
        }
    }
}

#[test]
fn the_oci_labels_come_from_build_arguments() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let rt = runtime(&d);
    let mut labels = BTreeMap::new();
    for i in rt.instructions {
        if let Instruction::Label(l) = i {
            for (k, v) in label_pairs(&l.arguments.value) {
                assert!(labels.insert(k.clone(), v).is_none(), "LABEL {k} twice");
            }
        }
    }
    let global: BTreeMap<String, Option<String>> = d
        .global_args()
        .map(|a| arg_of(&a.arguments.value))
        .collect();
    let in_stage: Vec<(usize, String)> = rt
        .instructions
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| match ins {
            Instruction::Arg(a) => Some((i, arg_of(&a.arguments.value).0)),
            _ => None,
        })
        .collect();
    let last_copy = copies(&rt).map(|(i, _)| i).max().expect("a COPY");
    let mut from_args = BTreeMap::new();
    for key in ["version", "revision", "source"] {
        let label = format!("org.opencontainers.image.{key}");
        let value = labels
            .get(&label)
            .unwrap_or_else(|| panic!("no LABEL {label}"));
        let arg = arg_reference(value)
            .unwrap_or_else(|| panic!("LABEL {label}={value:?} is not from an ARG"));
        // A global ARG reaches a stage only when the stage declares it again.
        let (at, _) = in_stage
            .iter()
            .find(|(_, n)| n == arg)
            .unwrap_or_else(|| panic!("the runtime stage does not declare ARG {arg}"));
        assert!(
            *at > last_copy,
            "ARG {arg} after the last COPY: a new revision changes no layer"
        );
        let default = global
            .get(arg)
            .unwrap_or_else(|| panic!("no global ARG {arg} (before the first FROM)"))
            .as_deref()
            .unwrap_or_else(|| panic!("global ARG {arg} has no default"));
        assert!(!default.is_empty(), "ARG {arg}'s default is empty");
        from_args.insert(key, default.to_string());
    }
    // An image built without --build-arg VERSION says the version it has.
    let cargo = cargo_toml();
    assert_eq!(
        Some(from_args["version"].as_str()),
        cargo
            .get("workspace")
            .and_then(|w| w.get("package"))
            .and_then(|p| p.get("version"))
            .and_then(|v| v.as_str()),
        "the VERSION default is the workspace version"
    );
    assert_eq!(
        labels
            .get("org.opencontainers.image.title")
            .map(String::as_str),
        Some("ipsetmgr")
    );
}

/// The binary's build info names the revision the image labels name: the
/// builder passes ARG REVISION to build.rs as IPSETMGR_REVISION (the context
/// has no .git), declared after the dependency cache so it never rebuilds it.
#[test]
fn the_builder_passes_the_revision_to_the_binary() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let builder = stage(&d, "builder");
    let (cook_at, _) = command(&builder, &["cargo", "chef", "cook"]);
    let (build_at, _) = command(&builder, &["cargo", "build"]);
    let arg_at = builder
        .instructions
        .iter()
        .position(
            |i| matches!(i, Instruction::Arg(a) if arg_of(&a.arguments.value).0 == "REVISION"),
        )
        .expect("the builder declares ARG REVISION");
    let env: Vec<(usize, String)> = builder
        .instructions
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| match ins {
            Instruction::Env(e) => label_pairs(&e.arguments.value)
                .remove("IPSETMGR_REVISION")
                .map(|v| (i, v)),
            _ => None,
        })
        .collect();
    let [(env_at, ref value)] = env[..] else {
        panic!(
            "one ENV IPSETMGR_REVISION in the builder, found {}",
            env.len()
        )
    };
    assert_eq!(
        arg_reference(value),
        Some("REVISION"),
        "ENV IPSETMGR_REVISION={value}"
    );
    assert!(
        cook_at < arg_at && arg_at < env_at && env_at < build_at,
        "cook, ARG REVISION, ENV, build: in that order, got {cook_at}, {arg_at}, {env_at}, {build_at}"
    );
    // The build script (with the telemetry that reports it) reads exactly
    // that variable.
    assert!(read("crates/cluster/build.rs").contains("std::env::var(\"IPSETMGR_REVISION\")"));
}

#[test]
fn expose_lists_the_four_ports() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let rt = runtime(&d);
    let mut exposed = BTreeSet::new();
    for i in rt.instructions {
        if let Instruction::Expose(e) = i {
            for port in &e.arguments {
                let (number, proto) = port.value.split_once('/').unwrap_or((&port.value, "tcp"));
                assert_eq!(proto, "tcp", "{}", port.value);
                let number: u16 = number
                    .parse()
                    .unwrap_or_else(|e| panic!("EXPOSE {}: {e}", port.value));
                assert!(exposed.insert(number), "EXPOSE {number} twice");
            }
        }
    }
    assert_eq!(exposed, BTreeSet::from(PORTS));
}

#[test]
fn the_image_runs_as_root_for_net_admin() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let rt = runtime(&d);
    let users: Vec<_> = rt
        .instructions
        .iter()
        .filter_map(|i| match i {
            Instruction::User(u) => Some(u),
            _ => None,
        })
        .collect();
    let [user] = users[..] else {
        panic!("one USER in the runtime stage, found {}", users.len())
    };
    // distroless's default user is root too; saying it keeps it visible
    // and survives a change of base (e.g. to a :nonroot tag).
    assert_eq!(user.arguments.value, "root");
    // The reason stands right above it: the comment block before USER.
    let mut above: Vec<&str> = text[..user.user.span.start]
        .lines()
        .rev()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.trim_start().starts_with('#'))
        .collect();
    above.reverse();
    let comment = above.join("\n");
    for why in ["CAP_NET_ADMIN", "ambient", "effective set", "65532"] {
        assert!(
            comment.contains(why),
            "the comment above USER root explains it ({why:?}): {comment}"
        );
    }
}

#[test]
fn the_dist_profile_strips_and_release_keeps_debug_info() {
    let cargo = cargo_toml();
    let profile = |name: &str| {
        cargo
            .get("profile")
            .and_then(|p| p.get(name))
            .and_then(|p| p.as_table())
            .unwrap_or_else(|| panic!("no [profile.{name}]"))
            .clone()
    };
    let dist = profile(PROFILE);
    assert_eq!(
        dist.get("inherits").and_then(|v| v.as_str()),
        Some("release")
    );
    // `debug = false` (or 0 / "none"): no DWARF in the shipped binary.
    let debug = dist.get("debug").expect("dist sets debug");
    assert!(
        matches!(debug, toml::Value::Boolean(false))
            || debug.as_integer() == Some(0)
            || debug.as_str() == Some("none"),
        "dist: debug = {debug:?}"
    );
    // `strip = true` is "symbols" (and debug info): the symbol table too.
    let strip = dist.get("strip").expect("dist sets strip");
    assert!(
        matches!(strip, toml::Value::Boolean(true)) || strip.as_str() == Some("symbols"),
        "dist: strip = {strip:?}"
    );
    // A panic is reported and unwound as in the release build.
    assert!(dist.get("panic").is_none(), "dist keeps release's panic");
    // The benches and profilers read release's line tables.
    let release = profile("release");
    assert_eq!(
        release.get("debug").and_then(|v| v.as_integer()),
        Some(1),
        "release keeps debug = 1 for cargo bench and profiling"
    );
    assert!(release.get("strip").is_none(), "release is not stripped");
}

#[test]
fn shell_commands_split_like_the_shell() {
    let script = "apt-get update \\\n && apt-get install -y \"a b\" c \\\n | tar -cf - ; x||y";
    assert_eq!(
        shell_commands(script),
        [
            vec!["apt-get", "update"],
            vec!["apt-get", "install", "-y", "a b", "c"],
            vec!["tar", "-cf", "-"],
            vec!["x"],
            vec!["y"],
        ]
    );
    assert_eq!(
        label_pairs("a=\"x y\" \\\n  b=${B} c=\"\""),
        BTreeMap::from([
            ("a".to_string(), "x y".to_string()),
            ("b".to_string(), "${B}".to_string()),
            ("c".to_string(), String::new()),
        ])
    );
    assert_eq!(arg_reference("${VERSION}"), Some("VERSION"));
    assert_eq!(arg_reference("$VERSION"), Some("VERSION"));
    assert_eq!(arg_reference("v${VERSION}"), None);
    assert_eq!(arg_reference("0.1.0"), None);
}

/// The parser's Debug output without its byte offsets (`span: A..B`,
/// `flag_start: N`), so that the same instructions at other places in a
/// file compare equal.
fn without_offsets(debug: &str) -> String {
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug;
    while let Some(i) = ["span: ", "flag_start: "]
        .iter()
        .filter_map(|key| rest.find(key).map(|i| (i, key.len())))
        .min()
    {
        let (at, len) = i;
        out.push_str(&rest[..at + len]);
        rest = rest[at + len..].trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        out.push('_');
    }
    out.push_str(rest);
    out
}

fn stage_debug(s: &Stage<'_, '_>) -> String {
    without_offsets(&format!("{:?} {:?}", s.from, s.instructions))
}

/// CI builds the image of the runtime stage around the binary it has already
/// built, from a Containerfile that e2e/runtime-image.sh derives from this
/// Dockerfile (e2e/README.md, real-node mode). It must be the same image but
/// for how the binary was compiled: the global ARGs and the ipset, nft and
/// runtime stages instruction for instruction (files, USER, LABELs, EXPOSE,
/// ENTRYPOINT), and in place of the compiling stages one that holds only
/// the binary at the path the runtime stage copies it from.
#[test]
fn the_ci_image_is_this_dockerfiles_runtime_stage() {
    let out = std::process::Command::new("bash")
        .arg(repo("e2e/runtime-image.sh"))
        .arg("--print")
        .output()
        .expect("run bash e2e/runtime-image.sh --print");
    assert!(
        out.status.success(),
        "e2e/runtime-image.sh --print: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let derived_text = String::from_utf8(out.stdout).expect("UTF-8");
    let original_text = read("Dockerfile");
    let (original, derived) = (parse(&original_text), parse(&derived_text));

    assert_eq!(
        without_offsets(&format!("{:?}", derived.global_args().collect::<Vec<_>>())),
        without_offsets(&format!("{:?}", original.global_args().collect::<Vec<_>>())),
        "global ARGs"
    );
    let names: Vec<String> = derived.stages().map(|s| stage_name(&s)).collect();
    assert_eq!(names, ["builder", "ipset", "nft", "(unnamed)"]);

    let builder = stage(&derived, "builder");
    assert_eq!(builder.from.image.value, "scratch");
    let [Instruction::Copy(copy)] = builder.instructions else {
        panic!("the binary's stage is one COPY: {:?}", builder.instructions)
    };
    assert!(copy.options.is_empty(), "{:?}", copy.options);
    let sources: Vec<&str> = copy
        .src
        .iter()
        .map(|s| match s {
            Source::Path(p) => p.value.as_ref(),
            other => panic!("COPY of a path expected: {other:?}"),
        })
        .collect();
    assert_eq!(sources, ["ipsetmgr"]);
    assert_eq!(copy.dest.value, BUILT);

    for name in ["ipset", "nft"] {
        assert_eq!(
            stage_debug(&stage(&derived, name)),
            stage_debug(&stage(&original, name)),
            "stage {name}"
        );
    }
    assert_eq!(
        stage_debug(&runtime(&derived)),
        stage_debug(&runtime(&original)),
        "the runtime stage"
    );
}

/// The image's binary has its XDP program: the builder installs clang (which
/// crates/bpf/build.rs compiles it with) before the build, and builds under
/// `CI=true`, where a missing clang fails the build rather than leaving the
/// program out (docs/bpf.md, "How the XDP object is built").
#[test]
fn the_builder_compiles_the_xdp_program() {
    let text = read("Dockerfile");
    let d = parse(&text);
    let builder = stage(&d, "builder");
    let (build_at, _) = command(&builder, &["cargo", "build"]);
    let (install_at, install) = command(&builder, &["apt-get", "install"]);
    assert!(has(&install, "clang"), "{install:?}");
    assert!(install_at < build_at, "clang is installed before the build");
    let ci: Vec<(usize, String)> = builder
        .instructions
        .iter()
        .enumerate()
        .filter_map(|(i, ins)| match ins {
            Instruction::Env(e) => label_pairs(&e.arguments.value).remove("CI").map(|v| (i, v)),
            _ => None,
        })
        .collect();
    let [(ci_at, ref value)] = ci[..] else {
        panic!("one ENV CI in the builder, found {}", ci.len())
    };
    assert_eq!(value, "true");
    assert!(ci_at < build_at, "ENV CI=true before the build");
    // What CI=true means to the build script that needs clang.
    let build_rs = read("crates/bpf/build.rs");
    assert!(build_rs.contains("\"clang\"") && build_rs.contains("std::env::var(\"CI\")"));
}
