//! The file-mode commands (`apply`, `run`, `sets`): policy files to kernel
//! sets through the manager, without a cluster; and `slice`, which turns a
//! member list into IPSetMemberSlice objects for a cluster.

pub mod apply;
pub mod run;
pub mod sets;
pub(crate) mod slice;
pub mod table;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::ipset::Naming;
use crate::policy::load::{load_file, policy_files};
use crate::policy::{Compiled, IPSetPolicy, LoadError, compile};

/// Policies read from files, compiled for this host.
pub struct FilePolicies {
    pub policies: Vec<IPSetPolicy>,
    pub compiled: Compiled,
    /// Files that could not be read or parsed; their policies are unknown.
    pub load_errors: Vec<LoadError>,
}

/// Read and compile every policy under `paths`. A file that fails to load
/// does not stop the others. `allow_empty`: a directory without policy files
/// means "no policies" (a watched directory whose last file was removed)
/// rather than an error (a mistyped path given to `apply`).
pub fn load(
    paths: &[PathBuf],
    naming: &Naming,
    labels: Option<&BTreeMap<String, String>>,
    allow_empty: bool,
) -> FilePolicies {
    let mut policies = Vec::new();
    let mut load_errors = Vec::new();
    for path in paths {
        let found = policy_files(path);
        if found.files.is_empty() && found.errors.is_empty() && !allow_empty {
            load_errors.push(LoadError::Empty(path.clone()));
        }
        load_errors.extend(found.errors);
        for f in found.files {
            match load_file(&f) {
                Ok(loaded) => policies.extend(loaded.into_iter().map(|l| l.policy)),
                Err(e) => load_errors.push(e),
            }
        }
    }
    let compiled = compile(&policies, naming, labels);
    FilePolicies {
        policies,
        compiled,
        load_errors,
    }
}
