//! nft's JSON (libnftables-json(5)) as typed serde values: the commands this
//! crate sends, built from typed elements, and the listings it reads back,
//! parsed into the same typed elements. No string is ever concatenated into
//! a command.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};

use ipsetmgr_ipset::{Comment, IfaceName, Proto};

use crate::element::{ElementRef, Elements};
use crate::spec::{FieldType, KeyType, NftSetSpec};
use crate::value::Value;
use crate::{NftOp, Table};

#[derive(Serialize)]
pub struct Script<'a> {
    pub nftables: Vec<Command<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Command<'a> {
    Add(Object<'a>),
    Delete(Object<'a>),
    Flush(Object<'a>),
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Object<'a> {
    Table(TableRef<'a>),
    Set(SetObj<'a>),
    /// Only deleted: a map of an owned name is a foreign shape, replaced by
    /// a set of ours.
    Map(SetObj<'a>),
    Element(ElementObj<'a>),
}

#[derive(Serialize)]
pub struct TableRef<'a> {
    pub family: &'a str,
    pub name: &'a str,
}

#[derive(Serialize)]
pub struct SetObj<'a> {
    pub family: &'a str,
    pub table: &'a str,
    pub name: &'a str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum KeyJson {
    One(String),
    Concat(Vec<String>),
}

impl KeyJson {
    pub fn of(key: &KeyType) -> KeyJson {
        let names: Vec<String> = key
            .fields()
            .iter()
            .map(|f| f.nft_name().to_string())
            .collect();
        match names.as_slice() {
            [one] => KeyJson::One(one.clone()),
            _ => KeyJson::Concat(names),
        }
    }

    pub fn key(&self) -> Option<KeyType> {
        let names: Vec<&str> = match self {
            KeyJson::One(s) => vec![s.as_str()],
            KeyJson::Concat(v) => v.iter().map(String::as_str).collect(),
        };
        let fields: Option<Vec<FieldType>> =
            names.iter().map(|n| FieldType::from_nft_name(n)).collect();
        KeyType::concat(&fields?)
    }
}

#[derive(Serialize)]
pub struct ElementObj<'a> {
    pub family: &'a str,
    pub table: &'a str,
    pub name: &'a str,
    pub elem: ElemList<'a>,
}

/// Elements serialized one by one from their bytes (a million are never
/// built as one JSON tree first); `comments`: whether to send them.
pub struct ElemList<'a> {
    pub elements: &'a Elements,
    /// Sub-range of the elements (the CLI narrows a failing op down).
    pub range: std::ops::Range<usize>,
    pub comments: bool,
}

impl Serialize for ElemList<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.range.len()))?;
        for i in self.range.clone() {
            if let Some(e) = self.elements.get(i) {
                seq.serialize_element(&ElemJson {
                    e,
                    comments: self.comments,
                })?;
            }
        }
        seq.end()
    }
}

struct ElemJson<'a> {
    e: ElementRef<'a>,
    comments: bool,
}

impl Serialize for ElemJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let typed = self.e.typed().map_err(serde::ser::Error::custom)?;
        let fields: Vec<FieldJson<'_>> = typed
            .key
            .iter()
            .enumerate()
            .map(|(i, v)| FieldJson {
                first: v,
                last: typed.key_end.as_ref().and_then(|e| e.get(i)),
            })
            .collect();
        let val = ValJson(&fields);
        match typed.comment.as_ref().filter(|_| self.comments) {
            Some(c) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(
                    "elem",
                    &CommentedJson {
                        val,
                        comment: c.as_str(),
                    },
                )?;
                m.end()
            }
            None => val.serialize(s),
        }
    }
}

#[derive(Serialize)]
struct CommentedJson<'a> {
    val: ValJson<'a>,
    comment: &'a str,
}

struct ValJson<'a>(&'a [FieldJson<'a>]);

impl Serialize for ValJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            [one] => one.serialize(s),
            many => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("concat", many)?;
                m.end()
            }
        }
    }
}

struct FieldJson<'a> {
    first: &'a Value,
    last: Option<&'a Value>,
}

impl Serialize for FieldJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.last {
            Some(last) if last != self.first => {
                let mut m = s.serialize_map(Some(1))?;
                match crate::interval::prefix_of(self.first, last) {
                    Some(len) => m.serialize_entry(
                        "prefix",
                        &PrefixJson {
                            addr: ScalarJson(self.first),
                            len,
                        },
                    )?,
                    None => {
                        m.serialize_entry("range", &[ScalarJson(self.first), ScalarJson(last)])?
                    }
                }
                m.end()
            }
            _ => ScalarJson(self.first).serialize(s),
        }
    }
}

#[derive(Serialize)]
struct PrefixJson<'a> {
    addr: ScalarJson<'a>,
    len: u8,
}

struct ScalarJson<'a>(&'a Value);

impl Serialize for ScalarJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Ipv4(a) => s.collect_str(a),
            Value::Ipv6(a) => s.collect_str(a),
            Value::Ether(_) => s.collect_str(self.0),
            Value::Proto(p) => s.serialize_u8(*p),
            Value::Service(p) => s.serialize_u16(*p),
            Value::Mark(m) => s.serialize_u32(*m),
            Value::Ifname(n) => s.serialize_str(n.as_str()),
        }
    }
}

/// The script for `ops` (`narrow`: only the elements `range` of op `at`,
/// and nothing after it; for finding a failing element). `maps`: the names
/// that are maps in the table, whose `DeleteSet` is nft's `delete map`.
pub fn script<'a>(
    table: &'a Table,
    ops: &'a [NftOp<'a>],
    narrow: Option<(usize, std::ops::Range<usize>)>,
    maps: &BTreeSet<String>,
) -> Script<'a> {
    let family = table.family.nft_name();
    let tname = table.name.as_str();
    let mut cmds = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let range_of = |e: &Elements| match &narrow {
            Some((at, r)) if *at == i => r.clone(),
            _ => 0..e.len(),
        };
        let set_ref = |name: &'a str| SetObj {
            family,
            table: tname,
            name,
            key: None,
            flags: None,
            size: None,
        };
        cmds.push(match op {
            NftOp::EnsureTable => Command::Add(Object::Table(TableRef {
                family,
                name: tname,
            })),
            NftOp::CreateSet { name, spec } => Command::Add(Object::Set(SetObj {
                key: Some(KeyJson::of(&spec.key)),
                flags: spec.interval.then(|| vec!["interval"]),
                size: spec.size,
                ..set_ref(name)
            })),
            NftOp::AddElements { set, elements } | NftOp::DelElements { set, elements } => {
                if elements.is_empty() {
                    continue;
                }
                // Only an add carries comments: a delete names elements by key.
                let adding = matches!(op, NftOp::AddElements { .. });
                let object = Object::Element(ElementObj {
                    family,
                    table: tname,
                    name: set,
                    elem: ElemList {
                        elements,
                        range: range_of(elements),
                        comments: adding,
                    },
                });
                if adding {
                    Command::Add(object)
                } else {
                    Command::Delete(object)
                }
            }
            NftOp::FlushSet { set } => Command::Flush(Object::Set(set_ref(set))),
            NftOp::DeleteSet { set } if maps.contains(*set) => {
                Command::Delete(Object::Map(set_ref(set)))
            }
            NftOp::DeleteSet { set } => Command::Delete(Object::Set(set_ref(set))),
        });
        if narrow.as_ref().is_some_and(|(at, _)| *at == i) {
            break;
        }
    }
    Script { nftables: cmds }
}

// ---------------------------------------------------------------- listings

#[derive(Deserialize, Debug)]
pub struct Listing {
    pub nftables: Vec<Item>,
}

/// One object of a listing: exactly one of these keys is set.
#[derive(Deserialize, Debug, Default)]
pub struct Item {
    // Named only so that they are not `other`: what they say is not needed.
    #[serde(default)]
    #[allow(dead_code)]
    pub metainfo: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub table: Option<JTable>,
    #[serde(default)]
    pub set: Option<JSet>,
    #[serde(default)]
    pub map: Option<JMap>,
    #[serde(default)]
    pub rule: Option<JRule>,
    /// Anything else: chains, counters, quotas, flowtables, ...
    #[serde(flatten)]
    pub other: BTreeMap<String, serde::de::IgnoredAny>,
}

/// A table as `nft -j list tables` shows it.
#[derive(Deserialize, Debug, Default)]
pub struct JTable {
    #[serde(default)]
    pub family: String,
    #[serde(default)]
    pub name: String,
    /// Left out when the table has none; nft 1.0.6 prints a garbled string
    /// here, later ones a list of names (`["owner"]`).
    #[serde(default)]
    pub flags: Option<serde_json::Value>,
}

#[derive(Deserialize, Debug)]
pub struct JSet {
    pub family: String,
    pub name: String,
    pub table: String,
    #[serde(rename = "type")]
    pub key: KeyJson,
    #[serde(default)]
    pub handle: u64,
    #[serde(default)]
    pub flags: Vec<String>,
    #[serde(default)]
    pub size: Option<u32>,
    #[serde(default)]
    pub elem: Vec<JElem>,
    #[serde(default)]
    pub timeout: Option<serde_json::Value>,
    #[serde(rename = "gc-interval", default)]
    pub gc_interval: Option<serde_json::Value>,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub stmt: Option<serde_json::Value>,
    /// Not a difference of shape; needed to read the text listing
    /// (text.rs), which prints it as it is.
    #[serde(default)]
    pub comment: Option<String>,
}

/// A map as `nft -j` lists it (`"map": {... "map": "verdict"}`). Every
/// field is optional and loosely typed: a map is someone else's object
/// unless its name is owned, and one this crate cannot read must never make
/// the table's listing unreadable.
#[derive(Deserialize, Debug, Default)]
pub struct JMap {
    #[serde(default)]
    pub family: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub table: String,
    #[serde(rename = "type", default)]
    pub key: serde_json::Value,
    #[serde(default)]
    pub handle: u64,
    /// An array of flag names (nft 1.0.6), or one name.
    #[serde(default)]
    pub flags: serde_json::Value,
}

#[derive(Deserialize, Debug)]
pub struct JRule {
    pub table: String,
    #[serde(default)]
    pub expr: serde_json::Value,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum JElem {
    Wrapped { elem: JElemBody },
    Plain(JVal),
}

#[derive(Deserialize, Debug)]
pub struct JElemBody {
    pub val: JVal,
    #[serde(default)]
    pub comment: Option<String>,
    /// Timeouts, counters: options this crate never sets.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde::de::IgnoredAny>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum JVal {
    Str(String),
    Num(u64),
    Prefix { prefix: JPrefix },
    Range { range: Box<[JVal; 2]> },
    Concat { concat: Vec<JVal> },
}

#[derive(Deserialize, Debug)]
pub struct JPrefix {
    pub addr: Box<JVal>,
    pub len: u8,
}

impl JMap {
    fn flags(&self) -> Vec<&str> {
        match &self.flags {
            serde_json::Value::String(f) => vec![f.as_str()],
            serde_json::Value::Array(a) => a.iter().filter_map(|f| f.as_str()).collect(),
            _ => Vec::new(),
        }
    }

    /// The key as a set's spec, when it is one this crate knows.
    pub fn spec(&self) -> Option<NftSetSpec> {
        let key = KeyJson::deserialize(&self.key).ok()?.key()?;
        Some(NftSetSpec {
            key,
            interval: self.flags().contains(&"interval"),
            size: None,
        })
    }

    /// `map` first (as the netlink backend says it), then its flags.
    pub fn unmanaged(&self) -> Vec<String> {
        std::iter::once("map".to_string())
            .chain(
                self.flags()
                    .into_iter()
                    .filter(|f| *f != "interval")
                    .map(|f| format!("flags {f}")),
            )
            .collect()
    }
}

impl JSet {
    pub fn spec(&self) -> Option<NftSetSpec> {
        Some(NftSetSpec {
            key: self.key.key()?,
            interval: self.flags.iter().any(|f| f == "interval"),
            size: self.size.filter(|&s| s != 0),
        })
    }

    pub fn unmanaged(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .flags
            .iter()
            .filter(|f| f.as_str() != "interval")
            .map(|f| format!("flags {f}"))
            .collect();
        if let Some(t) = &self.timeout {
            out.push(format!("timeout {t}"));
        }
        if let Some(g) = &self.gc_interval {
            out.push(format!("gc-interval {g}"));
        }
        if self.policy.as_deref() == Some("memory") {
            out.push("policy memory".into());
        }
        if self.stmt.is_some() {
            out.push("element expressions".into());
        }
        out
    }

    /// The elements, canonical, and how many did not fit the key.
    pub fn elements(&self, spec: &NftSetSpec) -> (Elements, usize) {
        let mut out = Elements::with_capacity(spec.key, spec.interval, self.elem.len());
        let mut bad = 0;
        let mut key = Vec::with_capacity(spec.key.len());
        let mut end = Vec::with_capacity(spec.key.len());
        for e in &self.elem {
            let (val, comment) = match e {
                JElem::Plain(v) => (v, None),
                JElem::Wrapped { elem } if elem.other.is_empty() => {
                    (&elem.val, elem.comment.as_deref())
                }
                JElem::Wrapped { .. } => {
                    bad += 1;
                    continue;
                }
            };
            let comment = match comment.map(Comment::parse) {
                Some(Ok(c)) => Some(c),
                Some(Err(_)) => {
                    bad += 1;
                    continue;
                }
                None => None,
            };
            key.clear();
            end.clear();
            let fields: &[JVal] = match (val, spec.key.is_concat()) {
                (JVal::Concat { concat }, true) => concat,
                (v, false) => std::slice::from_ref(v),
                _ => {
                    bad += 1;
                    continue;
                }
            };
            let ok = fields.len() == spec.key.fields().len()
                && fields
                    .iter()
                    .zip(spec.key.fields())
                    .all(|(v, &f)| match field_range(f, v) {
                        Some((a, b)) => {
                            a.encode(&mut key);
                            b.encode(&mut end);
                            spec.interval || a == b
                        }
                        None => false,
                    });
            spec.key.fit(&mut key);
            spec.key.fit(&mut end);
            let pushed = ok
                && out
                    .push_raw(&key, spec.interval.then_some(&end[..]), comment)
                    .is_ok();
            if !pushed {
                bad += 1;
            }
        }
        out.canonicalize();
        (out, bad)
    }
}

/// One field of a listed element: its first and last value.
fn field_range(f: FieldType, v: &JVal) -> Option<(Value, Value)> {
    match v {
        JVal::Prefix { prefix } => {
            let a = scalar(f, &prefix.addr)?;
            let last = match a {
                Value::Ipv4(x) => {
                    let m = u32::MAX.checked_shr(u32::from(prefix.len)).unwrap_or(0);
                    (prefix.len <= 32).then(|| Value::Ipv4(Ipv4Addr::from(u32::from(x) | m)))?
                }
                Value::Ipv6(x) => {
                    let m = u128::MAX.checked_shr(u32::from(prefix.len)).unwrap_or(0);
                    (prefix.len <= 128).then(|| Value::Ipv6(Ipv6Addr::from(u128::from(x) | m)))?
                }
                _ => return None,
            };
            Some((a, last))
        }
        JVal::Range { range } => Some((scalar(f, &range[0])?, scalar(f, &range[1])?)),
        v => {
            let x = scalar(f, v)?;
            Some((x.clone(), x))
        }
    }
}

fn scalar(f: FieldType, v: &JVal) -> Option<Value> {
    Some(match (f, v) {
        (FieldType::Ipv4Addr, JVal::Str(s)) => Value::Ipv4(s.parse().ok()?),
        (FieldType::Ipv6Addr, JVal::Str(s)) => Value::Ipv6(s.parse().ok()?),
        (FieldType::EtherAddr, JVal::Str(s)) => {
            let mut m = [0u8; 6];
            let mut parts = s.split(':');
            for b in &mut m {
                *b = u8::from_str_radix(parts.next()?, 16).ok()?;
            }
            if parts.next().is_some() {
                return None;
            }
            Value::Ether(m)
        }
        (FieldType::InetProto, JVal::Num(n)) => Value::Proto(u8::try_from(*n).ok()?),
        (FieldType::InetProto, JVal::Str(s)) => {
            let p = Proto::ALL
                .into_iter()
                .find(|p| p.ipset_name() == s || (s == "icmpv6" && *p == Proto::Icmpv6))?;
            Value::Proto(p.number())
        }
        (FieldType::InetService, JVal::Num(n)) => Value::Service(u16::try_from(*n).ok()?),
        (FieldType::InetService, JVal::Str(s)) => Value::Service(s.parse().ok()?),
        (FieldType::Mark, JVal::Num(n)) => Value::Mark(u32::try_from(*n).ok()?),
        (FieldType::Mark, JVal::Str(s)) => {
            let n = match s.strip_prefix("0x") {
                Some(h) => u32::from_str_radix(h, 16).ok()?,
                None => s.parse().ok()?,
            };
            Value::Mark(n)
        }
        (FieldType::Ifname, JVal::Str(s)) => Value::Ifname(IfaceName::parse(s).ok()?),
        _ => return None,
    })
}

/// Whether a rule's expressions mention `@set`.
pub fn references(expr: &serde_json::Value, set: &str) -> bool {
    match expr {
        serde_json::Value::String(s) => s.strip_prefix('@') == Some(set),
        serde_json::Value::Array(a) => a.iter().any(|v| references(v, set)),
        serde_json::Value::Object(o) => o.values().any(|v| references(v, set)),
        _ => false,
    }
}
