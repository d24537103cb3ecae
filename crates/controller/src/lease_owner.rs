//! The controller's Lease, owned by the controller's ServiceAccount, so the
//! garbage collector deletes it when the ServiceAccount goes (`helm
//! uninstall`). Releasing it on SIGTERM is not enough there: Helm deletes
//! the Deployment, the Roles and the ServiceAccount at once, so by the time
//! the pod gets SIGTERM its token and its rights may be gone, and the Lease
//! would keep naming the deleted pod until it expires (docs/install.md,
//! "Uninstall"). The ServiceAccount outlives every rollout, so a handover
//! between replicas keeps the Lease.
//!
//! Which ServiceAccount, and its uid, come from the pod's own token (a JWT
//! whose claims name them): no API call and no extra permission. The claims
//! are read, not verified: they only choose the owner of our own Lease, and
//! the API server checks that the owner exists in the namespace.

use base64::Engine;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;

/// Where a pod finds its ServiceAccount token.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// A token larger than this is not one (they are about 1 KiB).
const MAX_TOKEN_LEN: usize = 64 * 1024;

/// The ServiceAccount a token was issued to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Deserialize)]
struct Claims {
    #[serde(rename = "kubernetes.io")]
    kubernetes: KubernetesClaims,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: NamedUid,
}

#[derive(Deserialize)]
struct NamedUid {
    name: String,
    uid: String,
}

/// The ServiceAccount a bound token names; `None` for anything else (a
/// legacy token without these claims, not a JWT).
pub fn from_token(token: &str) -> Option<ServiceAccountRef> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let payload = token.trim().split('.').nth(1)?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let c: Claims = serde_json::from_slice(&json).ok()?;
    let sa = c.kubernetes.serviceaccount;
    let valid = |s: &str| !s.is_empty() && s.len() <= 253;
    (valid(&c.kubernetes.namespace) && valid(&sa.name) && valid(&sa.uid)).then_some(
        ServiceAccountRef {
            namespace: c.kubernetes.namespace,
            name: sa.name,
            uid: sa.uid,
        },
    )
}

/// The ServiceAccount of this pod, when it runs in one with a bound token.
pub fn this_pods_service_account() -> Option<ServiceAccountRef> {
    let token = std::fs::read(TOKEN_PATH).ok()?;
    from_token(std::str::from_utf8(&token).ok()?)
}

/// Make `sa` the owner of the Lease `name` in `namespace` (a merge patch of
/// `metadata.ownerReferences`; the Lease is the controller's own).
pub async fn own_lease(
    client: kube::Client,
    namespace: &str,
    name: &str,
    sa: &ServiceAccountRef,
) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let patch = serde_json::json!({
        "metadata": {
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "name": sa.name,
                "uid": sa.uid,
            }]
        }
    });
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &serde_json::Value) -> String {
        let e = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        format!(
            "{}.{}.{}",
            e(br#"{"alg":"RS256"}"#),
            e(claims.to_string().as_bytes()),
            e(b"signature")
        )
    }

    #[test]
    fn a_bound_token_names_its_service_account() {
        let t = jwt(&serde_json::json!({
            "aud": ["https://kubernetes.default.svc"],
            "kubernetes.io": {
                "namespace": "ipsetmgr-system",
                "pod": {"name": "c-1", "uid": "p"},
                "serviceaccount": {"name": "ipsetmgr-controller", "uid": "0b1e"}
            }
        }));
        assert_eq!(
            from_token(&t),
            Some(ServiceAccountRef {
                namespace: "ipsetmgr-system".into(),
                name: "ipsetmgr-controller".into(),
                uid: "0b1e".into(),
            })
        );
    }

    #[test]
    fn anything_else_names_none() {
        for t in [
            "",
            "not a jwt",
            "a.b.c",
            &jwt(&serde_json::json!({"sub": "system:serviceaccount:ns:sa"})),
            &jwt(
                &serde_json::json!({"kubernetes.io": {"namespace": "", "serviceaccount": {"name": "x", "uid": "y"}}}),
            ),
        ] {
            assert_eq!(from_token(t), None, "{t}");
        }
        assert_eq!(from_token(&"x".repeat(MAX_TOKEN_LEN + 1)), None);
    }
}
