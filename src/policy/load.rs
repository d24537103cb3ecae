//! Reading policies from multi-document YAML files, JSON files and
//! directories. JSON (`*.json`: one policy object or an array of them) is
//! for machine-generated lists: it parses about 20 times faster than YAML,
//! which matters for policies with millions of members.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::spec::{IPSetPolicy, IPSetPolicySpec};

const API_VERSION: &str = "ipsetmgr.io/v1alpha1";
const KIND: &str = "IPSetPolicy";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: document {index}: {message}")]
    Document {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{0}: no policy files (*.yaml, *.yml, *.json) found")]
    Empty(PathBuf),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Option<Metadata>,
    spec: Option<IPSetPolicySpec>,
}

#[derive(Deserialize)]
struct Metadata {
    name: Option<String>,
}

/// A policy with the file it came from, for error messages.
#[derive(Clone, Debug)]
pub struct LoadedPolicy {
    pub policy: IPSetPolicy,
    pub source: PathBuf,
}

/// Policy files at `path`: the file itself, or every `*.yaml`/`*.yml`/`*.json` below a
/// directory, sorted so runs are reproducible.
pub fn policy_files(path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| LoadError::Io {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let p = entry
                .map_err(|source| LoadError::Io {
                    path: dir.clone(),
                    source,
                })?
                .path();
            let hidden = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            {
                files.push(p);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn yaml_options() -> serde_saphyr::Options {
    // Policies may carry millions of members: raise the node and scalar
    // budgets (the defaults protect configs of a few hundred thousand nodes)
    // while keeping every other protection of the parser.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 40_000_000;
    budget.max_nodes = 20_000_000;
    budget.max_total_scalar_bytes = 1 << 30;
    budget.max_reader_input_bytes = Some(1 << 30);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Parse every `IPSetPolicy` document of one YAML text.
pub fn parse_policies(text: &str, path: &Path) -> Result<Vec<LoadedPolicy>, LoadError> {
    let docs: Vec<Document> = serde_saphyr::from_multiple_with_options(text, yaml_options())
        .map_err(|e| LoadError::Yaml {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    policies_of(docs, path)
}

/// Parse a JSON text: one policy object, or an array of them.
pub fn parse_json_policies(text: &str, path: &Path) -> Result<Vec<LoadedPolicy>, LoadError> {
    let docs = if text.trim_start().starts_with('[') {
        serde_json::from_str::<Vec<Document>>(text)
    } else {
        serde_json::from_str::<Document>(text).map(|d| vec![d])
    }
    .map_err(|e| LoadError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    policies_of(docs, path)
}

fn policies_of(docs: Vec<Document>, path: &Path) -> Result<Vec<LoadedPolicy>, LoadError> {
    let mut out = Vec::with_capacity(docs.len());
    for (i, doc) in docs.into_iter().enumerate() {
        let index = i + 1;
        let bad = |message: String| LoadError::Document {
            path: path.to_path_buf(),
            index,
            message,
        };
        if doc.api_version.as_deref() != Some(API_VERSION) || doc.kind.as_deref() != Some(KIND) {
            return Err(bad(format!(
                "expected apiVersion {API_VERSION} and kind {KIND}, found {} {}",
                doc.api_version.as_deref().unwrap_or("(none)"),
                doc.kind.as_deref().unwrap_or("(none)")
            )));
        }
        let name = doc
            .metadata
            .and_then(|m| m.name)
            .ok_or_else(|| bad("metadata.name is required".into()))?;
        let spec = doc
            .spec
            .ok_or_else(|| bad(format!("policy {name:?} has no spec")))?;
        out.push(LoadedPolicy {
            policy: IPSetPolicy::new(&name, spec),
            source: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// Load every policy from a file or directory.
pub fn load_policies(path: &Path) -> Result<Vec<LoadedPolicy>, LoadError> {
    let files = policy_files(path)?;
    if files.is_empty() {
        return Err(LoadError::Empty(path.to_path_buf()));
    }
    let mut all = Vec::new();
    for f in files {
        all.extend(load_file(&f)?);
    }
    Ok(all)
}

/// Load the policies of one file: JSON for `*.json`, YAML otherwise.
pub fn load_file(f: &Path) -> Result<Vec<LoadedPolicy>, LoadError> {
    let text = std::fs::read_to_string(f).map_err(|source| LoadError::Io {
        path: f.to_path_buf(),
        source,
    })?;
    if f.extension().is_some_and(|e| e == "json") {
        parse_json_policies(&text, f)
    } else {
        parse_policies(&text, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipset::SetType;

    #[test]
    fn multi_document_files_parse() {
        let text = "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a}\nspec: {type: hash:ip, members: [10.0.0.1]}\n---\napiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: b}\nspec:\n  type: hash:net\n  family: Dual\n  members: [\"::/0\"]\n";
        let got = parse_policies(text, Path::new("x.yaml")).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].policy.spec.set_type, SetType::HashNet);
        assert_eq!(got[1].policy.metadata.name.as_deref(), Some("b"));
    }

    #[test]
    fn json_object_and_array_parse() {
        let one = r#"{"apiVersion":"ipsetmgr.io/v1alpha1","kind":"IPSetPolicy","metadata":{"name":"j"},"spec":{"type":"hash:ip","members":["10.0.0.1"]}}"#;
        assert_eq!(
            parse_json_policies(one, Path::new("j.json")).unwrap().len(),
            1
        );
        let many = format!("[{one},{}]", one.replace("\"j\"", "\"k\""));
        let got = parse_json_policies(&many, Path::new("j.json")).unwrap();
        assert_eq!(got[1].policy.metadata.name.as_deref(), Some("k"));
        let e = parse_json_policies("{\"kind\":", Path::new("bad.json")).unwrap_err();
        assert!(e.to_string().starts_with("bad.json: "), "{e}");
    }

    #[test]
    fn wrong_kind_and_bad_type_are_errors() {
        let e = parse_policies(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
            Path::new("x.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("expected apiVersion"), "{e}");
        let e = parse_policies(
            "apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata: {name: a}\nspec: {type: hash:foo}\n",
            Path::new("x.yaml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("x.yaml"), "{e}");
    }
}
