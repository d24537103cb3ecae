//! What the kernel property suites share: their proptest configuration and
//! reading the member lines of `ipset list`.

use proptest::test_runner::{Config, RngSeed};

/// `Config::default()` honours the `PROPTEST_*` variables; `cases` applies
/// unless `PROPTEST_CASES` says otherwise. No regression files: a failure
/// prints its seed instead (fixed from the clock here), so runs leave the
/// tree clean.
#[allow(dead_code)] // the conformance suites list sets but run no properties
pub fn config(cases: u32) -> Config {
    let mut config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if config.rng_seed == RngSeed::Random {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        config.rng_seed = RngSeed::Fixed(now);
    }
    config
}

/// The member lines of an `ipset list` text, sorted.
#[allow(dead_code)] // not every suite that includes this file lists sets
pub fn listed_members(listing: &str) -> Vec<String> {
    let mut lines: Vec<String> = listing
        .lines()
        .skip_while(|l| *l != "Members:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}
