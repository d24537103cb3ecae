//! `spec.membersFrom` in policy files (`apply`, `run`): the `file` and `url`
//! sources, read and fetched by this process (there is no controller in file
//! mode). Each source becomes one more member list of its policy, named
//! `membersFrom[i] (kind)`, and compiled with it like a slice.
//!
//! - A `file` path is relative to the directory of the policy file that
//!   names it. It is read with the one member-list reader (bounded, regular
//!   files only, text/YAML/JSON by extension) and checked under the
//!   policy's type and family, so a bad line is named with its number.
//! - A `url` is run as the controller runs it (`ipsetmgr_feeds::feed::UrlFeed`:
//!   conditional requests, bounded bodies, no redirects, a failure retried
//!   from 10 s, doubling up to the interval).
//! - A `url` that fails keeps its last good members in force (`run`).
//!   A `file` that fails, or any source that never worked, holds its
//!   policy: the policy's kernel sets are left as they are, never emptied
//!   or deleted (`apply` reports it and fails). A file's list is not kept
//!   in memory between loads (a million members are 12 MB of text): it is
//!   read again for each compile, and only a digest is kept to tell
//!   whether it changed.
//! - Kubernetes sources (nodes, pods, services) hold the policy too, with a
//!   message naming the file, the policy, the source and why.
//!
//! Fetches happen in the namespace the process started in: `--netns` says
//! where the sets are, not where the network is.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

use ipsetmgr_api::FamilySpec;
use ipsetmgr_feeds::egress::EgressGuard;
use ipsetmgr_feeds::feed::{
    FETCH_TIMEOUT, FIRST_RETRY, Fetcher, MAX_FEED_BYTES, Refreshed, UrlFeed,
};
use ipsetmgr_ipset::SetType;
use ipsetmgr_policy::load::LoadedPolicy;
use ipsetmgr_policy::member_list::{MemberListError, read_member_list};
use ipsetmgr_policy::sources::content::{ContentError, check_list, digest};
use ipsetmgr_policy::sources::spec::{FileSpec, Setting, Source, UrlSpec, parse_sources};

/// A source: its policy's name and its index in `membersFrom`.
type Key = (String, usize);

/// What a source asks for; a change of any of it starts the source afresh.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wanted {
    kind: &'static str,
    job: Job,
    set_type: SetType,
    family: FamilySpec,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Job {
    /// A member list file, its path resolved against the policy file's
    /// directory.
    File(FileSpec),
    Url(UrlSpec),
    /// A source file mode cannot use: the policy file, and why.
    Refused {
        file: String,
        reason: String,
    },
}

/// Why a source gives no members now; either way its policy is held.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceProblem {
    /// The spec asks for what file mode cannot do: only an edit fixes it.
    #[error("{file}: {reason}")]
    Refused { file: String, reason: String },
    /// Not read or fetched yet, or what was read was bad: why.
    #[error("{0}")]
    Failed(String),
}

/// Why a `file` source's content was not taken.
#[derive(Debug, thiserror::Error)]
enum FileSourceError {
    /// The member-list reader's own wording points at `-` (standard input),
    /// which means nothing in a policy file.
    #[error("{}: not a regular file ({kind}); a file source must be a regular file", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(transparent)]
    List(MemberListError),
    #[error(transparent)]
    Content(#[from] ContentError),
}

impl From<MemberListError> for FileSourceError {
    fn from(e: MemberListError) -> Self {
        match e {
            MemberListError::NotRegular { path, kind } => {
                FileSourceError::NotRegular { path, kind }
            }
            other => FileSourceError::List(other),
        }
    }
}

/// A file's identity and version, to tell whether it changed since read.
type Stamp = (u64, u64, u64, i64, i64);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

struct Tracked {
    wanted: Wanted,
    /// The last good members, one per line: a million members kept as one
    /// text cost a fifth of a million strings. A file's is dropped after
    /// each compile (see [`LocalSources::forget_file_texts`]).
    good: Option<Arc<str>>,
    /// A digest of the last good members, kept while `good` is dropped: what
    /// tells whether what the compiler sees changed.
    digest: Option<[u8; 8]>,
    /// Why the last read or fetch failed.
    error: Option<String>,
    /// The file's stamp when it was last read.
    read: Option<Stamp>,
    /// A url's last good content, validators and backoff.
    feed: UrlFeed,
    /// When it is next looked at (url: fetched; file: stat'ed).
    due: Instant,
    /// A url being fetched now (its `feed` is with the fetch).
    in_flight: bool,
}

impl Tracked {
    fn new(wanted: Wanted, now: Instant) -> Tracked {
        Tracked {
            wanted,
            good: None,
            digest: None,
            error: None,
            read: None,
            feed: UrlFeed::default(),
            due: now,
            in_flight: false,
        }
    }

    /// What the compiler sees of it, for telling changes: the digest of its
    /// members, or why it has none.
    fn state(&self) -> Result<[u8; 8], SourceProblem> {
        match (&self.wanted.job, self.digest) {
            (Job::Refused { .. }, _) | (_, None) => Err(self.problem()),
            (_, Some(d)) => Ok(d),
        }
    }

    fn keep(&mut self, good: Arc<str>) {
        self.digest = Some(digest(good.split('\n')));
        self.good = Some(good);
    }

    /// What the compiler sees of it.
    fn view(&self) -> Result<Arc<str>, SourceProblem> {
        match (&self.wanted.job, &self.good) {
            (Job::Refused { .. }, _) | (_, None) => Err(self.problem()),
            (_, Some(g)) => Ok(g.clone()),
        }
    }

    /// Why it gives no members.
    fn problem(&self) -> SourceProblem {
        match &self.wanted.job {
            Job::Refused { file, reason } => SourceProblem::Refused {
                file: file.clone(),
                reason: reason.clone(),
            },
            Job::Url(_) if self.in_flight && self.error.is_none() => {
                SourceProblem::Failed("being fetched (held until it has delivered)".to_string())
            }
            _ => SourceProblem::Failed(
                self.error
                    .clone()
                    .unwrap_or_else(|| "not read yet".to_string()),
            ),
        }
    }
}

/// One source's members, as a member list of its policy.
pub(crate) struct SourceSlice {
    pub policy: String,
    /// `membersFrom[i] (kind)`, as messages name it.
    pub name: String,
    /// `Err` holds the policy.
    /// One member per line.
    pub members: Result<Arc<str>, SourceProblem>,
}

/// The HTTP client and the runtime its requests run on (its own thread),
/// made on first use, and where finished fetches come back.
struct FetchSide {
    /// Always `Some` until dropped.
    runtime: Option<tokio::runtime::Runtime>,
    fetcher: Fetcher,
    done_tx: std::sync::mpsc::Sender<Fetched>,
    done_rx: std::sync::mpsc::Receiver<Fetched>,
}

impl Drop for FetchSide {
    fn drop(&mut self) {
        // Fetches still in flight are abandoned, not waited for: a stop
        // must not wait for a server that does not answer.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// A fetch that came back: the source's state goes back to it.
struct Fetched {
    key: Key,
    spec: UrlSpec,
    feed: UrlFeed,
    /// The outcome, and how long until the next fetch.
    refreshed: Refreshed,
}

/// Whether a refresh waits for the fetches it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fetching {
    /// `apply`: one pass, so it waits (bounded).
    Wait,
    /// `run`: never; outcomes arrive later, with a wake-up.
    Background,
}

/// The sources of the policies loaded last, and what each last gave.
pub(crate) struct LocalSources {
    tracked: BTreeMap<Key, Tracked>,
    fetch: Option<FetchSide>,
    egress: EgressGuard,
    fetching: Fetching,
    /// Told when a background fetch has come back.
    wake: Option<std::sync::mpsc::Sender<()>>,
}

impl LocalSources {
    /// For one pass (`apply`): fetches are waited for.
    pub(crate) fn new(egress: EgressGuard) -> LocalSources {
        LocalSources {
            tracked: BTreeMap::new(),
            fetch: None,
            egress,
            fetching: Fetching::Wait,
            wake: None,
        }
    }

    /// For `run`: fetches go on in the background, and `wake` is sent to
    /// when one has come back.
    pub(crate) fn background(
        egress: EgressGuard,
        wake: std::sync::mpsc::Sender<()>,
    ) -> LocalSources {
        LocalSources {
            fetching: Fetching::Background,
            wake: Some(wake),
            ..LocalSources::new(egress)
        }
    }

    /// Track the sources of `policies`: ones unchanged keep their state
    /// (last good members, validators, schedule); new ones are due now;
    /// ones no longer named are forgotten.
    pub(crate) fn want(&mut self, policies: &[LoadedPolicy]) {
        let now = Instant::now();
        let mut wanted: BTreeMap<Key, Wanted> = BTreeMap::new();
        for lp in policies {
            let p = &lp.policy;
            if p.spec.members_from.is_empty() {
                continue;
            }
            let name = p.metadata.name.clone().unwrap_or_default();
            let base = lp.source.parent().unwrap_or(Path::new("."));
            let refused = |reason: String| Job::Refused {
                file: lp.source.display().to_string(),
                reason,
            };
            let wanted_as = |kind, job| Wanted {
                kind,
                job,
                set_type: p.spec.set_type,
                family: p.spec.family,
            };
            match parse_sources(p, Setting::Files) {
                Ok(sources) => {
                    for (index, s) in sources.into_iter().enumerate() {
                        let kind = s.kind();
                        let job = match s {
                            Source::File(f) => Job::File(FileSpec {
                                path: resolved(&base.join(&f.path)),
                                ..f
                            }),
                            Source::Url(u) => Job::Url(u),
                            // parse_sources refuses these in Setting::Files.
                            Source::Nodes(_) | Source::Pods(_) | Source::Services(_) => {
                                refused(format!("a {kind} source works only in a cluster"))
                            }
                        };
                        wanted.insert((name.clone(), index), wanted_as(kind, job));
                    }
                }
                // Any bad source makes the policy invalid; the others are
                // not read, as the controller does not read them either.
                Err(errors) => {
                    for e in errors {
                        wanted.insert(
                            (name.clone(), e.index),
                            wanted_as(e.kind, refused(e.reason)),
                        );
                    }
                }
            }
        }
        self.tracked
            .retain(|k, t| wanted.get(k).is_some_and(|w| *w == t.wanted));
        for (k, w) in wanted {
            self.tracked
                .entry(k)
                .or_insert_with(|| Tracked::new(w, now));
        }
    }

    /// Read the files that changed since they were read (all of them with
    /// `force_files`, and any whose last read failed) and fetch the urls
    /// that are due. Returns whether what the compiler sees changed.
    pub(crate) fn refresh(&mut self, now: Instant, force_files: bool) -> bool {
        let before = self.views();
        self.collect();
        let mut fetches = Vec::new();
        for (key, t) in &mut self.tracked {
            match t.wanted.job.clone() {
                Job::File(f) => {
                    if let Some(every) = f.interval {
                        t.due = now + every;
                    }
                    let current = stamp(&f.path);
                    if force_files || t.error.is_some() || t.digest.is_none() || current != t.read {
                        read_file(key, t, &f, current);
                    }
                }
                Job::Url(_) if t.due <= now && !t.in_flight => fetches.push(key.clone()),
                Job::Url(_) | Job::Refused { .. } => {}
            }
        }
        if !fetches.is_empty() {
            self.fetch_due(&fetches, now);
        }
        self.views() != before
    }

    /// Start fetching the given url sources, each on the fetch runtime's
    /// own thread: the caller's loop never waits on a server (one that
    /// accepts and never answers held every other policy for the 60 s
    /// timeout, and SIGTERM with it). Outcomes are taken by
    /// [`LocalSources::collect`]; in `apply` ([`Fetching::Wait`]) this waits
    /// for them, bounded by the fetch timeout.
    fn fetch_due(&mut self, keys: &[Key], now: Instant) {
        if self.fetch.is_none() {
            match fetch_side(&self.egress) {
                Ok(f) => self.fetch = Some(f),
                Err(e) => {
                    for k in keys {
                        if let Some(t) = self.tracked.get_mut(k) {
                            t.error = Some(e.clone());
                            t.due = now + FIRST_RETRY;
                        }
                    }
                    return;
                }
            }
        }
        let side = self.fetch.as_ref().expect("made above");
        for (key, t) in self.tracked.iter_mut().filter(|(k, _)| keys.contains(k)) {
            let Job::Url(spec) = &t.wanted.job else {
                continue;
            };
            if t.in_flight {
                continue;
            }
            t.in_flight = true;
            let (spec, set_type, family) = (spec.clone(), t.wanted.set_type, t.wanted.family);
            let mut feed = std::mem::take(&mut t.feed);
            let (fetcher, done, wake, key) = (
                side.fetcher.clone(),
                side.done_tx.clone(),
                self.wake.clone(),
                key.clone(),
            );
            let runtime = side.runtime.as_ref().expect("alive until dropped");
            runtime.spawn(async move {
                let refreshed = feed
                    .refresh(&spec, set_type, family, &fetcher, &HeaderMap::new())
                    .await;
                let _ = done.send(Fetched {
                    key,
                    spec,
                    feed,
                    refreshed,
                });
                if let Some(w) = wake {
                    let _ = w.send(());
                }
            });
        }
        if self.fetching == Fetching::Wait {
            self.wait_for_fetches();
        }
    }

    /// `apply`: wait until every fetch in flight has come back (each is
    /// bounded by the fetch timeout; this by a little more).
    fn wait_for_fetches(&mut self) {
        let deadline = Instant::now() + FETCH_TIMEOUT + Duration::from_secs(5);
        while self.tracked.values().any(|t| t.in_flight) {
            let Some(side) = &self.fetch else { return };
            let left = deadline.saturating_duration_since(Instant::now());
            match side.done_rx.recv_timeout(left) {
                Ok(f) => self.take_fetched(f),
                Err(_) => return,
            }
        }
    }

    /// Take the outcomes of the fetches that have come back.
    pub(crate) fn collect(&mut self) {
        let Some(side) = &self.fetch else { return };
        let done: Vec<Fetched> = side.done_rx.try_iter().collect();
        for f in done {
            self.take_fetched(f);
        }
    }

    fn take_fetched(&mut self, f: Fetched) {
        let Fetched {
            key,
            spec,
            feed,
            refreshed: Refreshed { outcome, next },
        } = f;
        // The source changed (or went) while it was fetched: that answer
        // is for a spec no longer wanted.
        let Some(t) = self
            .tracked
            .get_mut(&key)
            .filter(|t| t.wanted.job == Job::Url(spec.clone()))
        else {
            return;
        };
        t.in_flight = false;
        t.feed = feed;
        t.due = Instant::now() + next;
        match outcome {
            Ok(new_content) => {
                if t.error.take().is_some() {
                    tracing::info!(policy = %key.0, source = key.1, "url source fetched again");
                }
                // Not modified: what was kept from the last download stands.
                if new_content && let Some(g) = t.feed.state.good.as_deref().map(|g| lines_of(g)) {
                    t.keep(g);
                }
            }
            Err(e) => {
                let e = ipsetmgr_policy::text::bounded(&e.detail, 1024).into_owned();
                if t.good.is_some() {
                    tracing::warn!(policy = %key.0, source = key.1, error = %e, "url source failed; its last good members stay in force");
                }
                t.error = Some(e);
            }
        }
    }

    /// Whether a file source changed since it was read (a stat each).
    pub(crate) fn files_changed(&self) -> bool {
        self.tracked.values().any(|t| match &t.wanted.job {
            Job::File(f) => stamp(&f.path) != t.read,
            _ => false,
        })
    }

    /// When the next url is due to be fetched, or file to be looked at.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.tracked
            .values()
            .filter(|t| match &t.wanted.job {
                Job::File(f) => f.interval.is_some(),
                Job::Url(_) => true,
                Job::Refused { .. } => false,
            })
            .map(|t| t.due)
            .min()
    }

    /// The member list files, to be watched.
    pub(crate) fn files(&self) -> BTreeSet<PathBuf> {
        self.tracked
            .values()
            .filter_map(|t| match &t.wanted.job {
                Job::File(f) => Some(f.path.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every source's members (or why it has none), for the compiler.
    pub(crate) fn slices(&self) -> Vec<SourceSlice> {
        self.tracked
            .iter()
            .map(|((policy, index), t)| SourceSlice {
                policy: policy.clone(),
                name: format!("membersFrom[{index}] ({})", t.wanted.kind),
                members: t.view(),
            })
            .collect()
    }

    fn views(&self) -> Vec<Result<[u8; 8], SourceProblem>> {
        self.tracked.values().map(Tracked::state).collect()
    }

    /// Read again the files whose text was dropped after the last compile,
    /// before the next one. One that fails now holds its policy.
    pub(crate) fn load_file_texts(&mut self) {
        for (key, t) in &mut self.tracked {
            if let Job::File(f) = t.wanted.job.clone()
                && t.good.is_none()
                && t.digest.is_some()
            {
                let current = stamp(&f.path);
                read_file(key, t, &f, current);
            }
        }
    }

    /// Drop the files' texts once compiled: the kernel side holds the
    /// members now, and the next compile reads the files again.
    pub(crate) fn forget_file_texts(&mut self) {
        for t in self.tracked.values_mut() {
            if matches!(t.wanted.job, Job::File(_)) {
                t.good = None;
            }
        }
    }
}

/// Members (canonical, so without line breaks) as one text, one per line.
fn lines_of(members: &[String]) -> Arc<str> {
    Arc::from(members.join("\n"))
}

/// Read and check one member list file; on failure its policy is held (the
/// kernel keeps what the last good read put there).
fn read_file(key: &Key, t: &mut Tracked, f: &FileSpec, current: Option<Stamp>) {
    let path = &f.path;
    // No cap unless asked: see FileSpec::max_members.
    let max = f.max_members.unwrap_or(usize::MAX);
    let result = read_member_list(path, None)
        .map_err(FileSourceError::from)
        .and_then(|list| Ok(check_list(list, t.wanted.set_type, t.wanted.family, max)?))
        .map_err(|e| e.to_string());
    match result {
        Ok(content) => {
            if t.error.take().is_some() {
                tracing::info!(policy = %key.0, source = key.1, file = %path.display(), "file source reads again");
            }
            t.keep(lines_of(&content.members));
            t.read = current;
        }
        Err(e) => {
            let e = ipsetmgr_policy::text::bounded(&e, 1024).into_owned();
            if t.digest.is_some() || t.error.as_ref() != Some(&e) {
                tracing::warn!(policy = %key.0, source = key.1, error = %e, "file source failed; its policy is held, its kernel sets stay as they are");
            }
            t.good = None;
            t.digest = None;
            t.error = Some(e);
            // Not marked read: it is tried again at the next look.
        }
    }
}

/// A list's path, absolute and without `.` or `..` (lexically: the file
/// need not exist yet). The watch reports changes by the path it watches,
/// and `policies/../lists/l.txt` from a relative `--policy-dir` is not the
/// path a change is reported under, so edits waited for the next resync.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn fetch_side(egress: &EgressGuard) -> Result<FetchSide, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("ipsetmgr-fetch")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the HTTP client's runtime: {e}"))?;
    let fetcher =
        Fetcher::new(FETCH_TIMEOUT, MAX_FEED_BYTES, egress.clone()).map_err(|e| e.to_string())?;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    Ok(FetchSide {
        runtime: Some(runtime),
        fetcher,
        done_tx,
        done_rx,
    })
}

/// The loopback HTTP server tests/cli_netns.rs serves its feeds with.
#[cfg(test)]
#[path = "../../../../tests/common/loopback.rs"]
mod loopback;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{FilePolicies, load, read_files};
    use ipsetmgr_ipset::Naming;

    /// File mode's defaults: the tests' feeds are on loopback.
    fn files_guard() -> EgressGuard {
        EgressGuard::new(ipsetmgr_feeds::egress::Setting::Files, &[], &[])
    }

    fn policy(name: &str, set_type: &str, from: &str) -> String {
        let inline = if set_type == "hash:ip" {
            "10.0.0.1"
        } else {
            "10.0.0.0/8"
        };
        format!(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {{name: {name}}}\nspec:\n  type: {set_type}\n  members: [{inline}]\n  membersFrom:\n{from}"
        )
    }

    /// Write a policy file `file` into `dir`.
    fn write_policy(dir: &Path, file: &str, name: &str, set_type: &str, from: &str) {
        std::fs::write(dir.join(file), policy(name, set_type, from)).unwrap();
    }

    /// `policy` is among the held ones (its kernel sets stay as they are).
    fn held(files: &FilePolicies, policy: &str) -> bool {
        files.compiled.held.iter().any(|h| h == policy)
    }

    fn load_dir(dir: &Path) -> FilePolicies {
        load(
            &[dir.to_path_buf()],
            &[],
            &Naming::default(),
            None,
            false,
            &files_guard(),
        )
    }

    fn members_of(files: &FilePolicies, set: &str) -> Vec<String> {
        let s = files
            .compiled
            .sets
            .iter()
            .find(|s| s.name == set)
            .unwrap_or_else(|| panic!("no set {set}: {:?}", files.compiled.errors));
        let mut m: Vec<String> = s.members.iter().map(|m| m.to_string()).collect();
        m.sort();
        m
    }

    const FIREHOL: &str = "#\n# firehol_level1\n#\n# ipv4 hash:net ipset\n#\n\n192.0.2.0/24\n198.51.100.7/24  # host bits\n\n203.0.113.0/24\n2001:db8::/32\n";

    #[test]
    fn a_firehol_file_relative_to_the_policy_file_joins_its_policy() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("policies")).unwrap();
        std::fs::create_dir(d.path().join("lists")).unwrap();
        std::fs::write(d.path().join("lists/level1.netset"), FIREHOL).unwrap();
        write_policy(
            &d.path().join("policies"),
            "drop.yaml",
            "drop",
            "hash:net",
            "    - file: {path: ../lists/level1.netset}\n",
        );
        let files = load_dir(&d.path().join("policies"));
        files.assert_no_errors();
        // The IPv6 network is left out of the IPv4 policy.
        assert_eq!(
            members_of(&files, "ipm4-drop"),
            [
                "10.0.0.0/8",
                "192.0.2.0/24",
                "198.51.100.0/24",
                "203.0.113.0/24"
            ]
        );
    }

    #[test]
    fn a_bad_line_holds_the_policy_naming_the_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("l.txt"), "192.0.2.1\n\n# c\n192.0.2.300\n").unwrap();
        write_policy(
            d.path(),
            "p.yaml",
            "allow",
            "hash:ip",
            "    - file: {path: l.txt}\n",
        );
        std::fs::write(
            d.path().join("q.yaml"),
            policy("other", "hash:net", "    []\n").replace("  membersFrom:\n    []\n", ""),
        )
        .unwrap();
        let files = load_dir(d.path());
        assert!(files.load_errors.is_empty(), "{:?}", files.load_errors);
        let e = files.compile_errors();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("policy \"allow\": slice \"membersFrom[0] (file)\": "),
            "{}",
            e[0]
        );
        assert!(e[0].contains("l.txt: line 4: \"192.0.2.300\""), "{}", e[0]);
        assert!(held(&files, "allow"), "{:?}", files.compiled.held);
        // The other policy still applies.
        assert_eq!(members_of(&files, "ipm4-other"), ["10.0.0.0/8"]);
        // A missing file, a directory and a FIFO are errors of the policy
        // too; the last two say what a file source must be (not the CLI
        // reader's "use - to read standard input").
        nix::unistd::mkfifo(&d.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let not_regular = |kind: &str| {
            format!("not a regular file ({kind}); a file source must be a regular file")
        };
        for (path, needle) in [
            ("nope.txt", "nope.txt".to_string()),
            (".", not_regular("a directory")),
            ("pipe", not_regular("a FIFO")),
        ] {
            write_policy(
                d.path(),
                "p.yaml",
                "allow",
                "hash:ip",
                &format!("    - file: {{path: \"{path}\"}}\n"),
            );
            let files = load_dir(d.path());
            let e = files.compiled.errors[0].to_string();
            assert!(
                e.contains("membersFrom[0] (file)") && e.contains(&needle),
                "{e}"
            );
            assert!(!e.contains("standard input"), "{e}");
            assert!(held(&files, "allow"), "{:?}", files.compiled.held);
        }
    }

    /// `n` distinct IPv4 addresses, one a line, FireHOL style.
    fn big_list(n: u32) -> String {
        let mut text = String::with_capacity(n as usize * 14 + 64);
        text.push_str("# a big blocklist\n");
        for i in 0..n {
            let [_, a, b, c] = i.to_be_bytes();
            text.push_str(&format!("10.{a}.{b}.{c}\n"));
        }
        text
    }

    #[test]
    fn a_file_source_takes_a_million_members_unless_max_members_says_less() {
        const N: u32 = 1_000_000;
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("big.txt"), big_list(N)).unwrap();
        let from = |extra: &str| format!("    - file: {{path: big.txt{extra}}}\n");
        write_policy(d.path(), "p.yaml", "big", "hash:ip", &from(""));
        let inputs = read_files(&[d.path().to_path_buf()], &[], false);
        let mut sources = LocalSources::new(files_guard());
        sources.want(&inputs.policies);
        assert!(sources.refresh(Instant::now(), true));
        let got = &sources.slices()[0];
        assert_eq!(
            got.members.as_ref().map(|m| m.lines().count()),
            Ok(N as usize)
        );

        // An explicit maxMembers still refuses a longer list.
        write_policy(
            d.path(),
            "p.yaml",
            "big",
            "hash:ip",
            &from(", maxMembers: 999999"),
        );
        let inputs = read_files(&[d.path().to_path_buf()], &[], false);
        sources.want(&inputs.policies);
        sources.refresh(Instant::now(), true);
        let e = sources.slices()[0].members.clone().unwrap_err().to_string();
        assert!(
            e.ends_with("big.txt: 1000000 members, more than maxMembers (999999)"),
            "{e}"
        );
    }

    #[test]
    fn kubernetes_sources_in_files_are_refused_naming_file_policy_and_source() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("l.txt"), "192.0.2.1\n").unwrap();
        write_policy(
            d.path(),
            "k.yaml",
            "nodes",
            "hash:ip",
            "    - file: {path: l.txt}\n    - nodes: {}\n",
        );
        let files = load_dir(d.path());
        let file = d.path().join("k.yaml");
        assert_eq!(
            files.compile_errors(),
            [format!(
                "policy \"nodes\": membersFrom[1] (nodes) in {} is refused: a Kubernetes source works only in a cluster (the controller computes it); policy files can use url and file sources",
                file.display()
            )]
        );
        assert!(held(&files, "nodes"), "{:?}", files.compiled.held);
        // A file source the spec gets wrong is refused in the same words.
        write_policy(
            d.path(),
            "k.yaml",
            "nodes",
            "hash:ip",
            "    - file: {path: l.txt, interval: 10ms}\n",
        );
        let e = load_dir(d.path()).compile_errors();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with(&format!(
                "policy \"nodes\": membersFrom[0] (file) in {} is refused: interval: ",
                file.display()
            )),
            "{}",
            e[0]
        );
    }

    #[test]
    fn a_failing_file_holds_its_policy_and_a_change_is_seen() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("l.txt");
        std::fs::write(&list, "192.0.2.1\n").unwrap();
        write_policy(
            d.path(),
            "p.yaml",
            "p",
            "hash:ip",
            "    - file: {path: l.txt, interval: 5s}\n",
        );
        let inputs = read_files(&[d.path().to_path_buf()], &[], false);
        let mut sources = LocalSources::new(files_guard());
        sources.want(&inputs.policies);
        let now = Instant::now();
        assert!(sources.refresh(now, false));
        assert_eq!(sources.next_due(), Some(now + Duration::from_secs(5)));
        assert_eq!(sources.files(), BTreeSet::from([list.clone()]));
        assert!(!sources.files_changed());
        let good = sources.slices()[0].members.clone().unwrap();
        assert_eq!(&*good, "192.0.2.1");

        // Compiled, the text is dropped; an unchanged file is not read
        // again by a look, only before the next compile.
        sources.forget_file_texts();
        assert!(!sources.refresh(Instant::now(), false), "nothing changed");
        assert!(
            sources.slices()[0].members.is_err(),
            "not read again by a look"
        );
        sources.load_file_texts();
        assert_eq!(sources.slices()[0].members.as_ref().unwrap(), &good);

        // A broken list holds the policy (its kernel sets stay as the last
        // good read made them), naming the line.
        std::fs::write(&list, "192.0.2.1\nnot-an-ip\n").unwrap();
        assert!(sources.files_changed());
        assert!(sources.refresh(Instant::now(), false), "good -> failing");
        let e = sources.slices()[0].members.clone().unwrap_err().to_string();
        assert!(e.contains("l.txt: line 2: \"not-an-ip\""), "{e}");

        std::fs::remove_file(&list).unwrap();
        sources.refresh(Instant::now(), true);
        assert!(sources.slices()[0].members.is_err());

        std::fs::write(&list, "192.0.2.2\n").unwrap();
        assert!(sources.refresh(Instant::now(), false));
        assert_eq!(&*sources.slices()[0].members.clone().unwrap(), "192.0.2.2");
        // The same policies again keep the state; a changed source starts afresh.
        sources.want(&inputs.policies);
        assert!(sources.slices()[0].members.is_ok());
        write_policy(
            d.path(),
            "p.yaml",
            "p",
            "hash:ip",
            "    - file: {path: other.txt}\n",
        );
        sources.want(&read_files(&[d.path().to_path_buf()], &[], false).policies);
        assert_eq!(
            sources.slices()[0].members.as_ref().unwrap_err(),
            &SourceProblem::Failed("not read yet".into())
        );
    }

    /// A feed that answers `body` with an ETag, 304 to that ETag, and
    /// HTTP 500 from its third request on; counts the requests.
    fn serve(body: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use axum::http::{HeaderMap as H, StatusCode};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/l1.netset",
            axum::routing::get(move |h: H| {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if h.get("if-none-match").is_some_and(|v| v == "\"v1\"") {
                        return (StatusCode::NOT_MODIFIED, [("etag", "\"v1\"")], "");
                    }
                    if n >= 2 {
                        return (StatusCode::INTERNAL_SERVER_ERROR, [("etag", "\"x\"")], "");
                    }
                    (StatusCode::OK, [("etag", "\"v1\"")], body)
                }
            }),
        );
        (
            format!("http://{}/l1.netset", super::loopback::serve(app)),
            hits,
        )
    }

    #[test]
    fn url_sources_are_fetched_conditionally_and_keep_their_last_good_members() {
        let (url, hits) = serve(FIREHOL);
        let d = tempfile::tempdir().unwrap();
        write_policy(
            d.path(),
            "p.yaml",
            "feed",
            "hash:net",
            &format!("    - url: {{url: \"{url}\", interval: 1m}}\n"),
        );
        let files = load_dir(d.path());
        files.assert_no_errors();
        assert_eq!(members_of(&files, "ipm4-feed").len(), 4);

        let inputs = read_files(&[d.path().to_path_buf()], &[], false);
        let mut sources = LocalSources::new(files_guard());
        sources.want(&inputs.policies);
        let t0 = Instant::now();
        assert!(sources.refresh(t0, false));
        let due = sources.next_due().unwrap();
        assert!(due >= t0 + Duration::from_secs(60), "due on its interval");
        // Not due: not fetched.
        let before = hits.load(std::sync::atomic::Ordering::SeqCst);
        assert!(!sources.refresh(t0, false));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), before);
        // Due: a 304 (the ETag was sent) changes nothing.
        assert!(!sources.refresh(due, false));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), before + 1);
        // The server fails (the ETag changed on the server's side is not
        // ours to know; force a whole fetch): last good members stay.
        for t in sources.tracked.values_mut() {
            t.feed.state.validators = Default::default();
        }
        let due = sources.next_due().unwrap();
        assert!(!sources.refresh(due, false));
        assert_eq!(
            sources.slices()[0]
                .members
                .as_ref()
                .unwrap()
                .lines()
                .count(),
            3
        );
        let t = sources.tracked.values().next().unwrap();
        assert!(
            t.error.as_deref().unwrap().contains("HTTP 500"),
            "{:?}",
            t.error
        );
        assert!(
            t.due < Instant::now() + Duration::from_secs(11),
            "retried soon"
        );

        // A server that is not there: the policy is held, naming the URL.
        write_policy(
            d.path(),
            "p.yaml",
            "feed",
            "hash:net",
            "    - url: {url: \"http://127.0.0.1:1/x\"}\n",
        );
        let files = load_dir(d.path());
        let e = files.compiled.errors[0].to_string();
        assert!(
            e.contains("membersFrom[0] (url)")
                && e.contains("http://127.0.0.1:1/x: request failed"),
            "{e}"
        );
        assert!(held(&files, "feed"), "{:?}", files.compiled.held);
    }
}
