//! Why a `membersFrom` source is refused ([`SourceReason`]) and why its
//! URL is ([`FeedUrlError`]): typed, so that callers can tell the reasons
//! apart; each Display is the sentence statuses and file mode show, after
//! `policy "p": membersFrom[i] (kind): ` (`spec::SourceError`).

use std::time::Duration;

use ipsetmgr_ipset::SetType;

use crate::duration::DurationError;
use crate::selector::SelectorProblem;

/// Why one source (or the policy's sources as a whole) is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceReason {
    #[error("at most {max} sources; found {found}")]
    TooManySources { max: usize, found: usize },
    /// Its slices name the policy in a label value.
    #[error(
        "a policy with membersFrom has a name of at most {max} characters (its slices name it in the label ipsetmgr.io/policy)"
    )]
    NameTooLong { max: usize },
    #[error("each entry needs exactly one of nodes, pods, services, url, file")]
    NoKind,
    #[error(
        "a Kubernetes source works only in a cluster (the controller computes it); policy files can use url and file sources"
    )]
    ClusterOnly,
    #[error(
        "a file source works only in policy files (the controller reads no local files); use url"
    )]
    FilesOnly,
    /// A cluster source gives addresses: only address types hold them.
    #[error("gives IP addresses, which a {0} set cannot hold (use hash:ip or hash:net)")]
    NotAddresses(SetType),
    /// `field` is the selector's name in the source (`podSelector`, ...).
    #[error("{field}: {problem}")]
    Selector {
        field: &'static str,
        problem: SelectorProblem,
    },
    #[error("url: {0}")]
    Url(FeedUrlError),
    #[error("interval: {0}")]
    Interval(DurationError),
    #[error("interval: {interval:?} is shorter than the minimum of {min:?}")]
    IntervalTooShort { interval: Duration, min: Duration },
    #[error("headersFrom names a Secret, which works only in a cluster")]
    HeadersInFiles,
    /// Reading a Secret needs a grant no component has (tests/manifests.rs
    /// holds that line).
    #[error("headersFrom is not supported yet: the controller is not granted to read Secrets")]
    HeadersUnsupported,
    #[error("path: empty")]
    EmptyPath,
    #[error("path: contains a NUL byte")]
    NulInPath,
}

/// Why a url source's URL is refused (`spec::FeedUrl::parse`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeedUrlError {
    /// http's own sentence (its error is neither `Clone` nor comparable).
    #[error("not a URL: {0}")]
    NotAUrl(String),
    #[error("scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("no scheme (http:// or https://)")]
    NoScheme,
    #[error("no host")]
    NoHost,
    /// Credentials belong in headers from a Secret, never in a URL that is
    /// shown in logs and statuses; the URL is therefore not echoed.
    #[error("user information in a URL is refused (use headersFrom for credentials)")]
    UserInfo,
}
