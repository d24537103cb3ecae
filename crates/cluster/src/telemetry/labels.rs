//! Label sets of the metrics. Each is bounded: policies (by the number of
//! policies), API resources, write results and apply outcomes (a few
//! values each), never members, nodes or error texts.

use prometheus_client::encoding::EncodeLabelSet;

/// One policy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub policy: String,
}

/// One watched kind of the API, by its plural resource name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: String,
}

/// Whether a write to the API server was accepted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

impl ResultLabel {
    pub fn of(ok: bool) -> ResultLabel {
        ResultLabel {
            result: if ok { "success" } else { "failure" }.to_string(),
        }
    }
}

/// Whether a kernel apply completed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

impl OutcomeLabel {
    pub fn of(ok: bool) -> OutcomeLabel {
        OutcomeLabel {
            outcome: if ok { "success" } else { "failure" }.to_string(),
        }
    }
}

/// Which kind of kernel set: `ipset` or `nft` (with `--backend both`, a
/// node holds each set as both).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub backend: String,
}

impl BackendLabel {
    pub fn of(kind: &str) -> BackendLabel {
        BackendLabel {
            backend: kind.to_string(),
        }
    }
}
