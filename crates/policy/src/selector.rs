//! Evaluating a policy's `nodeSelector` against a node's labels, with
//! kube's own `Selector` (the same semantics as the API server's).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use crate::k8s_names::LabelError;

/// A refused nodeSelector (or namespace, pod or service selector).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid nodeSelector: {0}")]
pub struct SelectorError(pub SelectorProblem);

/// What is wrong with a selector: what the API server's
/// `ValidateLabelSelector` would refuse, or what kube cannot parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorProblem {
    #[error("{0}")]
    Label(#[from] LabelError),
    #[error("operator {operator} on {key:?} needs values")]
    NeedsValues { operator: String, key: String },
    #[error("operator {operator} on {key:?} takes no values (got {values:?})")]
    TakesNoValues {
        operator: String,
        key: String,
        values: Vec<String>,
    },
    #[error("operator {operator:?} on {key:?}: use In, NotIn, Exists or DoesNotExist")]
    UnknownOperator { operator: String, key: String },
    /// kube's own parse error, as it words it (its type is neither `Clone`
    /// nor `Eq`, which policy errors are).
    #[error("{0}")]
    Unparsable(String),
}

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
    validate(sel).map_err(SelectorError)?;
    let parsed = Selector::try_from(sel.clone())
        .map_err(|e| SelectorError(SelectorProblem::Unparsable(e.to_string())))?;
    Ok(Some(parsed))
}

/// What the API server's `ValidateLabelSelector` refuses: keys and values
/// that are not label keys and values, operators other than the four, In
/// and NotIn without values, Exists and DoesNotExist with values (kube's
/// conversion would quietly ignore them, or match nothing).
fn validate(sel: &LabelSelector) -> Result<(), SelectorProblem> {
    use crate::k8s_names::{label_key, label_value};
    for (k, v) in sel.match_labels.iter().flatten() {
        label_key(k)?;
        label_value(v)?;
    }
    for req in sel.match_expressions.iter().flatten() {
        label_key(&req.key)?;
        let values = req.values.as_deref().unwrap_or_default();
        match (req.operator.as_str(), values.is_empty()) {
            ("In" | "NotIn", true) => {
                return Err(SelectorProblem::NeedsValues {
                    operator: req.operator.clone(),
                    key: req.key.clone(),
                });
            }
            ("Exists" | "DoesNotExist", false) => {
                return Err(SelectorProblem::TakesNoValues {
                    operator: req.operator.clone(),
                    key: req.key.clone(),
                    values: values.to_vec(),
                });
            }
            ("In" | "NotIn" | "Exists" | "DoesNotExist", _) => {}
            (other, _) => {
                return Err(SelectorProblem::UnknownOperator {
                    operator: other.to_string(),
                    key: req.key.clone(),
                });
            }
        }
        for v in values {
            label_value(v)?;
        }
    }
    Ok(())
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

    /// What a real API server refuses in a label selector is refused here
    /// (these were Valid and applied, or selected nothing, before).
    #[test]
    fn selectors_the_api_server_refuses_are_refused() {
        let expr = |key: &str, op: &str, values: Option<Vec<&str>>| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: values.map(|v| v.into_iter().map(String::from).collect()),
            }]),
        };
        let cases = [
            (expr("role", "Exists", Some(vec!["x"])), "takes no values"),
            (
                expr("role", "DoesNotExist", Some(vec!["x"])),
                "takes no values",
            ),
            (expr("rôle", "Exists", None), "label key"),
            (expr("bad key!", "Exists", None), "label key"),
            (expr("role", "In", Some(vec!["not a value"])), "label value"),
        ];
        for (sel, why) in cases {
            let e = matches(Some(&sel), &labels(&[])).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        let bad_label = LabelSelector {
            match_labels: Some(labels(&[("bad key!", "x")])),
            match_expressions: None,
        };
        assert!(matches(Some(&bad_label), &labels(&[])).is_err());
        let bad_value = LabelSelector {
            match_labels: Some(labels(&[("role", "-x")])),
            match_expressions: None,
        };
        assert!(matches(Some(&bad_value), &labels(&[])).is_err());
        assert!(
            matches(
                Some(&expr("ipsetmgr.io/role", "Exists", Some(vec![]))),
                &labels(&[])
            )
            .is_ok()
        );
    }

    /// The texts users read (statuses, logs) are the ones written before
    /// the errors were typed.
    #[test]
    fn selector_errors_read_as_before() {
        let sel = |key: &str, op: &str, values: Option<Vec<&str>>| {
            let s = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: key.into(),
                    operator: op.into(),
                    values: values.map(|v| v.into_iter().map(String::from).collect()),
                }]),
            };
            parse(Some(&s)).unwrap_err().to_string()
        };
        assert_eq!(
            sel("a", "In", None),
            "invalid nodeSelector: operator In on \"a\" needs values"
        );
        assert_eq!(
            sel("a", "Exists", Some(vec!["x"])),
            "invalid nodeSelector: operator Exists on \"a\" takes no values (got [\"x\"])"
        );
        assert_eq!(
            sel("a", "Near", Some(vec!["x"])),
            "invalid nodeSelector: operator \"Near\" on \"a\": use In, NotIn, Exists or DoesNotExist"
        );
        assert_eq!(
            sel("-a", "Exists", None),
            "invalid nodeSelector: label key \"-a\": the name must be 1 to 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit (an optional DNS-subdomain prefix and '/' before it)"
        );
        assert_eq!(
            sel("a", "In", Some(vec!["-x"])),
            "invalid nodeSelector: label value \"-x\": must be empty or 1 to 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        );
        assert!(
            sel("-.x/a", "Exists", None)
                .starts_with("invalid nodeSelector: label key \"-.x/a\": its prefix must be"),
            "{}",
            sel("-.x/a", "Exists", None)
        );
    }
}
