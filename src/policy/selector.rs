//! Evaluating a policy's `nodeSelector` against a node's labels, with
//! kube's own `Selector` (the same semantics as the API server's).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid nodeSelector: {0}")]
pub struct SelectorError(pub String);

/// Whether `labels` satisfy `selector` (absent selector: every node).
/// An empty selector matches everything, as in Kubernetes.
pub fn matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    Ok(parse(selector)?.is_none_or(|s| s.matches(labels)))
}

/// A selector parsed once, for matching many objects (`None`: everything).
pub fn parse(selector: Option<&LabelSelector>) -> Result<Option<Selector>, SelectorError> {
    let Some(sel) = selector else { return Ok(None) };
    // The API server refuses In/NotIn without values; kube's conversion
    // would accept an empty list (matching nothing, or everything).
    for req in sel.match_expressions.iter().flatten() {
        let no_values = req.values.as_deref().unwrap_or_default().is_empty();
        if no_values && matches!(req.operator.as_str(), "In" | "NotIn") {
            return Err(SelectorError(format!(
                "operator {} on {:?} needs values",
                req.operator, req.key
            )));
        }
    }
    let parsed = Selector::try_from(sel.clone()).map_err(|e| SelectorError(e.to_string()))?;
    Ok(Some(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("role", "edge")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: "NotIn".into(),
                values: Some(vec!["a".into()]),
            }]),
        };
        assert!(matches(Some(&sel), &labels(&[("role", "edge"), ("zone", "b")])).unwrap());
        assert!(matches(Some(&sel), &labels(&[("role", "edge")])).unwrap());
        assert!(!matches(Some(&sel), &labels(&[("role", "edge"), ("zone", "a")])).unwrap());
        assert!(!matches(Some(&sel), &labels(&[("role", "core")])).unwrap());
        assert!(matches(None, &labels(&[])).unwrap());
        assert!(matches(Some(&LabelSelector::default()), &labels(&[])).unwrap());
    }

    #[test]
    fn bad_operator_is_an_error() {
        let sel = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "Near".into(),
                values: None,
            }]),
        };
        assert!(matches(Some(&sel), &labels(&[])).is_err());
        let empty_in = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "In".into(),
                values: Some(vec![]),
            }]),
        };
        assert!(matches(Some(&empty_in), &labels(&[])).is_err());
    }
}
