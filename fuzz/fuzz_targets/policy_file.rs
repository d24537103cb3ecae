//! Fuzz the policy-file path end to end: bytes → loader (YAML or JSON) →
//! compiler → rendered errors. Nothing of it may panic, hang or allocate
//! without bound, whatever a file holds.
//!
//! Input layout: the first byte chooses the format (odd: YAML, even: JSON;
//! the seeds start with `Y` or `J`), the rest is the file text, lossily
//! decoded when it is not UTF-8 (a real file that is not UTF-8 fails to
//! read before parsing, so only the text matters).
//!
//! Run from the repository root (nightly, `cargo install cargo-fuzz`):
//!
//! ```text
//! cargo +nightly fuzz run policy_file fuzz/corpus/policy_file -- -max_total_time=240
//! ```
//!
//! The call into the loader is kept to the two public parse functions so
//! the target follows their changes (BOM handling, size bounds, strictness)
//! without edits. Member slices in the text join their policy as in file
//! mode.
#![no_main]

use std::path::Path;

use ipsetmgr_ipset::Naming;
use ipsetmgr_policy::compile::{MemberCache, MemberList, PolicyInput, SliceInput, compile_inputs};
use ipsetmgr_policy::load::{parse_json_policies, parse_policies};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&format, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let loaded = if format % 2 == 1 {
        parse_policies(&text, Path::new("fuzz.yaml"))
    } else {
        parse_json_policies(&text, Path::new("fuzz.json"))
    };
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            // Error messages quote user input: rendering must not panic.
            let _ = e.to_string();
            return;
        }
    };
    // Slices join the policy their label names, as in file mode.
    let inputs: Vec<PolicyInput<'_>> = loaded
        .policies
        .iter()
        .map(|l| PolicyInput {
            policy: &l.policy,
            slices: loaded
                .slices
                .iter()
                .filter(|s| l.policy.metadata.name.as_deref() == Some(s.policy.as_str()))
                .map(|s| SliceInput {
                    name: &s.name,
                    version: "",
                    members: Ok(MemberList::Strings(&s.members)),
                })
                .collect(),
        })
        .collect();
    let compiled = compile_inputs(&inputs, &Naming::default(), None, &mut MemberCache::default());
    for e in &compiled.errors {
        let _ = e.to_string();
    }
    // Accepted members are rendered into restore scripts and reports.
    for set in &compiled.sets {
        for m in set.members.iter() {
            let _ = m.to_string();
        }
    }
});
