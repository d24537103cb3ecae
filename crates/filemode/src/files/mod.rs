//! File mode's inputs: policy files and `--members` lists read from disk,
//! with their file and url member sources (`sources`), compiled into the
//! desired sets of this host. The binary's, because only file mode reads
//! them; the parsing itself is `ipsetmgr_policy`'s.

pub(crate) mod sources;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use ipsetmgr_policy::{PolicyError, PolicyErrorKind};

use ipsetmgr_feeds::egress::EgressGuard;
use sources::{LocalSources, SourceProblem, SourceSlice};

use ipsetmgr_ipset::Naming;
use ipsetmgr_policy::compile::{
    MemberCache, MemberList, NoMembers, OwnedMembers, PolicyInput, SliceInput, compile_inputs,
};
use ipsetmgr_policy::load::{LoadedPolicy, LoadedSlice, load_file, policy_files};
use ipsetmgr_policy::member_list::read_member_list;
use ipsetmgr_policy::{Compiled, IPSetPolicy, LoadError};

/// A plain member list given for a policy (`--members POLICY=FILE`): it
/// joins the policy's members as a slice would.
#[derive(Clone, Debug)]
pub struct MembersFile {
    pub policy: String,
    pub path: PathBuf,
}

/// Policies read from files, compiled for this host.
pub struct FilePolicies {
    pub policies: Vec<IPSetPolicy>,
    pub compiled: Compiled,
    /// Files that could not be read or parsed; their policies are unknown.
    pub load_errors: Vec<LoadError>,
}

/// Read and compile every policy under `paths`, with the member slices the
/// files hold, the plain member lists of `members` and the policies'
/// `membersFrom` sources (read and fetched once). A file that fails to
/// load does not stop the others. `allow_empty`: a directory without
/// policy files means "no policies" (a watched directory whose last file
/// was removed) rather than an error (a mistyped path given to `apply`).
pub fn load(
    paths: &[PathBuf],
    members: &[MembersFile],
    naming: &Naming,
    labels: Option<&BTreeMap<String, String>>,
    allow_empty: bool,
    egress: &EgressGuard,
) -> FilePolicies {
    let inputs = read_files(paths, members, allow_empty);
    let mut sources = LocalSources::new(egress.clone());
    sources.want(&inputs.policies);
    sources.refresh(std::time::Instant::now(), true);
    inputs.compile(naming, labels, &sources)
}

/// What the policy files (and plain member lists) hold, not compiled yet.
pub(crate) struct FileInputs {
    pub policies: Vec<LoadedPolicy>,
    pub slices: Vec<LoadedSlice>,
    pub load_errors: Vec<LoadError>,
    /// Policies held whatever else they hold (a member list that did not
    /// load, a slice name given twice), and why.
    pub held: Vec<(String, String)>,
}

/// Read every policy file under `paths` and the lists of `members`.
pub(crate) fn read_files(
    paths: &[PathBuf],
    members: &[MembersFile],
    allow_empty: bool,
) -> FileInputs {
    let mut policies = Vec::new();
    let mut slices = Vec::new();
    let mut load_errors = Vec::new();
    let mut held = Vec::new();
    for path in paths {
        let found = policy_files(path);
        if found.files.is_empty() && found.errors.is_empty() && !allow_empty {
            load_errors.push(LoadError::Empty(path.clone()));
        }
        load_errors.extend(found.errors);
        for f in found.files {
            match load_file(&f) {
                Ok(loaded) => {
                    policies.extend(loaded.policies);
                    slices.extend(loaded.slices);
                }
                Err(e) => load_errors.push(e),
            }
        }
    }
    for m in members {
        match read_member_list(&m.path, None) {
            Ok(list) => slices.push(LoadedSlice {
                name: list.source.display().to_string(),
                policy: m.policy.clone(),
                members: OwnedMembers::Strings(list.members.into_iter().map(|m| m.text).collect()),
                source: list.source,
                from_list: true,
            }),
            // A list that does not load holds its policy: never the policy
            // without the members the list gave before.
            Err(e) => {
                held.push((m.policy.clone(), e.to_string()));
                load_errors.push(LoadError::MemberList {
                    policy: m.policy.clone(),
                    message: e.to_string(),
                });
            }
        }
    }
    // By name only: a copy of the policies would copy their members.
    let names: HashSet<&str> = policies
        .iter()
        .filter_map(|l| l.policy.metadata.name.as_deref())
        .collect();
    let (errors, duplicated) = slice_errors(&names, &slices);
    load_errors.extend(errors);
    held.extend(duplicated);
    FileInputs {
        policies,
        slices,
        load_errors,
        held,
    }
}

impl FileInputs {
    /// Compile for this host, with what `sources` last gave.
    pub(crate) fn compile(
        self,
        naming: &Naming,
        labels: Option<&BTreeMap<String, String>>,
        sources: &LocalSources,
    ) -> FilePolicies {
        let compiled = compile_with_slices(
            &self.policies,
            &self.slices,
            &sources.slices(),
            &self.held,
            naming,
            labels,
        );
        FilePolicies {
            policies: self.policies.into_iter().map(|l| l.policy).collect(),
            compiled,
            load_errors: self.load_errors,
        }
    }
}

/// Slices whose policy (of the `known` names) no file defines, and slice
/// names given twice: both are load errors (so nothing is pruned), never
/// silently dropped members. The latter also hold the policies of both
/// (which members are meant is not known), returned with why.
fn slice_errors(
    known: &HashSet<&str>,
    slices: &[LoadedSlice],
) -> (Vec<LoadError>, Vec<(String, String)>) {
    let mut seen: HashMap<&str, &LoadedSlice> = HashMap::new();
    let mut errors = Vec::new();
    let mut held = Vec::new();
    for s in slices {
        if !known.contains(s.policy.as_str()) {
            errors.push(LoadError::OrphanSlice {
                path: s.source.clone(),
                slice: s.name.clone(),
                policy: s.policy.clone(),
            });
        }
        if s.from_list {
            continue;
        }
        if let Some(first) = seen.insert(&s.name, s) {
            let e = LoadError::DuplicateSlice {
                slice: s.name.clone(),
                first: first.source.clone(),
                second: s.source.clone(),
            };
            held.push((first.policy.clone(), e.to_string()));
            held.push((s.policy.clone(), e.to_string()));
            errors.push(e);
        }
    }
    (errors, held)
}

fn compile_with_slices(
    policies: &[LoadedPolicy],
    slices: &[LoadedSlice],
    from_sources: &[SourceSlice],
    held: &[(String, String)],
    naming: &Naming,
    labels: Option<&BTreeMap<String, String>>,
) -> Compiled {
    let mut by_policy: HashMap<&str, Vec<SliceInput<'_>>> = HashMap::new();
    for s in slices {
        by_policy.entry(&s.policy).or_default().push(SliceInput {
            name: &s.name,
            // Slices from files are not cached across loads.
            version: "",
            members: Ok(s.members.list()),
        });
    }
    for s in from_sources {
        by_policy.entry(&s.policy).or_default().push(SliceInput {
            name: &s.name,
            version: "",
            members: match &s.members {
                Ok(m) => Ok(MemberList::Lines(m)),
                Err(SourceProblem::Failed(why)) => Err(NoMembers::Unreadable(why)),
                Err(SourceProblem::Refused { file, reason }) => {
                    Err(NoMembers::Refused { file, reason })
                }
            },
        });
    }
    let inputs: Vec<PolicyInput<'_>> = policies
        .iter()
        .map(|loaded| {
            let policy = &loaded.policy;
            let slices = policy
                .metadata
                .name
                .as_deref()
                .and_then(|n| by_policy.get(n))
                .cloned()
                .unwrap_or_default();
            let mut input = PolicyInput::new(policy, slices);
            input.members = Some(loaded.members());
            let name = policy.metadata.name.as_deref().unwrap_or("");
            input.held_by = held
                .iter()
                .filter(|(p, _)| p == name)
                .map(|(_, why)| PolicyError::of_policy(name, PolicyErrorKind::Held(why.clone())))
                .collect();
            input
        })
        .collect();
    compile_inputs(&inputs, naming, labels, &mut MemberCache::default())
}

#[cfg(test)]
impl FilePolicies {
    /// The compile errors as printed, for tests to match.
    pub(crate) fn compile_errors(&self) -> Vec<String> {
        self.compiled.errors.iter().map(|e| e.to_string()).collect()
    }

    /// Panics, listing them, unless nothing failed to load or compile.
    pub(crate) fn assert_no_errors(&self) {
        assert!(self.load_errors.is_empty(), "{:?}", self.load_errors);
        assert!(
            self.compiled.errors.is_empty(),
            "{:?}",
            self.compiled.errors
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: drop}\nspec:\n  type: hash:net\n  members: [10.0.0.0/8]\n";

    fn slice(name: &str, policy: &str, members: &str) -> String {
        format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetMemberSlice\nmetadata:\n  name: {name}\n  labels: {{ipsetmgr.io/policy: {policy}}}\nspec:\n  members: {members}\n"
        )
    }

    fn load_dir(files: &[(&str, String)], members: &[MembersFile]) -> FilePolicies {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(d.path().join(name), text).unwrap();
        }
        load(
            &[d.path().to_path_buf()],
            members,
            &Naming::default(),
            None,
            false,
            &EgressGuard::new(ipsetmgr_feeds::egress::Setting::Files, &[], &[]),
        )
    }

    fn members_of(files: &FilePolicies) -> Vec<String> {
        let mut m: Vec<String> = files.compiled.sets[0]
            .members
            .iter()
            .map(|m| m.to_string())
            .collect();
        m.sort();
        m
    }

    #[test]
    fn slices_in_files_join_their_policy() {
        let same_file = format!("{POLICY}---\n{}", slice("drop-1", "drop", "[192.0.2.0/24]"));
        let files = load_dir(
            &[
                ("a.yaml", same_file),
                ("b.yaml", slice("drop-2", "drop", "['198.51.100.0/24']")),
            ],
            &[],
        );
        files.assert_no_errors();
        assert_eq!(
            members_of(&files),
            ["10.0.0.0/8", "192.0.2.0/24", "198.51.100.0/24"]
        );
    }

    #[test]
    fn a_bad_member_in_a_slice_holds_the_policy_and_names_the_slice() {
        let files = load_dir(
            &[
                ("a.yaml", POLICY.to_string()),
                ("b.yaml", slice("drop-1", "drop", "['300.1.1.0/24']")),
            ],
            &[],
        );
        assert!(files.compiled.sets.is_empty());
        let e = files.compiled.errors[0].to_string();
        assert!(e.contains("drop-1") && e.contains("300.1.1.0/24"), "{e}");
        assert!(!files.compiled.held.is_empty(), "its kernel sets are held");
    }

    #[test]
    fn a_slice_without_its_policy_or_given_twice_is_a_load_error() {
        let files = load_dir(
            &[
                ("a.yaml", POLICY.to_string()),
                ("b.yaml", slice("other-1", "other", "[192.0.2.1]")),
                ("c.yaml", slice("drop-1", "drop", "[192.0.2.2]")),
                ("d.yaml", slice("drop-1", "drop", "[192.0.2.3]")),
            ],
            &[],
        );
        let errors: Vec<String> = files.load_errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("\"other-1\"") && errors[0].contains("\"other\""));
        assert!(errors[1].contains("defined twice") && errors[1].contains("d.yaml"));
    }

    #[test]
    fn a_slice_may_not_say_what_only_its_policy_says() {
        let text =
            slice("drop-1", "drop", "[192.0.2.1]").replace("spec:\n", "spec:\n  type: hash:ip\n");
        let files = load_dir(&[("a.yaml", POLICY.to_string()), ("b.yaml", text)], &[]);
        let e = files.load_errors[0].to_string();
        assert!(e.contains("b.yaml") && e.contains("spec.type"), "{e}");
        let unlabelled = slice("drop-1", "drop", "[192.0.2.1]")
            .replace("  labels: {ipsetmgr.io/policy: drop}\n", "");
        let files = load_dir(
            &[("a.yaml", POLICY.to_string()), ("b.yaml", unlabelled)],
            &[],
        );
        assert!(
            files.load_errors[0]
                .to_string()
                .contains("ipsetmgr.io/policy")
        );
    }

    #[test]
    fn plain_member_lists_join_the_named_policy() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("drop.netset");
        std::fs::write(
            &list,
            "# FireHOL style\n192.0.2.0/24\n198.51.100.0/24 ; SBL1\n",
        )
        .unwrap();
        let given = |policy: &str| {
            vec![MembersFile {
                policy: policy.into(),
                path: list.clone(),
            }]
        };
        let files = load_dir(&[("a.yaml", POLICY.to_string())], &given("drop"));
        assert!(files.load_errors.is_empty(), "{:?}", files.load_errors);
        assert_eq!(
            members_of(&files),
            ["10.0.0.0/8", "192.0.2.0/24", "198.51.100.0/24"]
        );
        let files = load_dir(&[("a.yaml", POLICY.to_string())], &given("nope"));
        assert!(files.load_errors[0].to_string().contains("drop.netset"));
        std::fs::write(&list, "# nothing but comments\n").unwrap();
        let files = load_dir(&[("a.yaml", POLICY.to_string())], &given("drop"));
        let e = files.load_errors[0].to_string();
        assert!(
            e.contains("policy \"drop\"") && e.contains("no members"),
            "{e}"
        );
    }
}
