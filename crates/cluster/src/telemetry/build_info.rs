//! `ipsetmgr_build_info{version,revision} 1`: which build is running where.

//! The revision is recorded by this crate's build script (build.rs).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The source revision it was built from (see `crates/cluster/build.rs`),
/// or "unknown".
pub const REVISION: &str = env!("IPSETMGR_REVISION");

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    revision: String,
}

pub fn register(registry: &mut Registry) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels {
        version: VERSION.to_string(),
        revision: REVISION.to_string(),
    })
    .set(1);
    registry.register(
        "ipsetmgr_build_info",
        "Always 1; the labels say which build runs",
        info,
    );
}
