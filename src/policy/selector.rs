//! Evaluating a Kubernetes `LabelSelector` against a node's labels.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid nodeSelector: {0}")]
pub struct SelectorError(pub String);

/// Whether `labels` satisfy `selector` (absent selector: every node).
/// An empty selector matches everything, as in Kubernetes.
pub fn matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let Some(sel) = selector else { return Ok(true) };
    if let Some(ml) = &sel.match_labels
        && ml.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return Ok(false);
    }
    for req in sel.match_expressions.iter().flatten() {
        let value = labels.get(&req.key);
        let values = req.values.as_deref().unwrap_or(&[]);
        let ok = match req.operator.as_str() {
            "In" => {
                if values.is_empty() {
                    return Err(SelectorError(format!(
                        "operator In on {:?} needs values",
                        req.key
                    )));
                }
                value.is_some_and(|v| values.contains(v))
            }
            "NotIn" => {
                if values.is_empty() {
                    return Err(SelectorError(format!(
                        "operator NotIn on {:?} needs values",
                        req.key
                    )));
                }
                value.is_none_or(|v| !values.contains(v))
            }
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => return Err(SelectorError(format!("unknown operator {other:?}"))),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
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
    }
}
