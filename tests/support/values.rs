//! The chart's values as Helm prepares them before rendering: the defaults
//! of `values.yaml`, `--set`-style overrides merged in, then checked against
//! `values.schema.json` (Helm refuses to render values that fail it).
//!
//! Shared by tests/manifests/ (through `support`) and tests/chart_schema.rs
//! (by path); each uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};

pub const SCHEMA: &str = "charts/ipsetmgr/values.schema.json";
pub const VALUES: &str = "charts/ipsetmgr/values.yaml";

pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// values.yaml as Helm reads it.
pub fn defaults() -> Value {
    serde_saphyr::from_str(&read(VALUES)).unwrap_or_else(|e| panic!("{VALUES}: {e}"))
}

/// Values as `helm --set a.b=v` would give them: merged into the defaults,
/// and `null` deletes the key (as Helm's coalescing does).
pub fn set_path(values: &mut Value, path: &str, v: Value) {
    let mut cur = values;
    let keys: Vec<&str> = path.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        cur = cur
            .as_object_mut()
            .unwrap()
            .entry(k.to_string())
            .or_insert_with(|| json!({}));
    }
    let last = keys[keys.len() - 1];
    if v.is_null() {
        cur.as_object_mut().unwrap().remove(last);
    } else {
        cur[last] = v;
    }
}

/// The defaults with these overrides.
pub fn with(overrides: &[(&str, Value)]) -> Value {
    let mut values = defaults();
    for (path, v) in overrides {
        set_path(&mut values, path, v.clone());
    }
    values
}

/// values.schema.json, compiled once (as draft-07, which it declares and
/// Helm 3 reads).
pub fn validator() -> &'static jsonschema::Validator {
    static V: OnceLock<jsonschema::Validator> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(&read(SCHEMA))
            .unwrap_or_else(|e| panic!("{SCHEMA}: not JSON: {e}"));
        jsonschema::draft7::new(&schema).unwrap_or_else(|e| panic!("{SCHEMA}: {e}"))
    })
}

/// Why the schema refuses these values (empty: it accepts them).
pub fn schema_errors(values: &Value) -> Vec<String> {
    validator()
        .iter_errors(values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}
