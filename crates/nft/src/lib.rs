//! nftables named sets as a kernel: the kernel layer, and
//! [`backend::NftKernel`], the adapter the neutral reconciler
//! (`ipsetmgr_sets::Reconciler`) keeps them with (`--backend nft|nft-cli`).
//!
//! - [`backend`]: desired sets held in one table: their names, their nft
//!   form (list:sets flattened), one transaction per apply, the kernel's
//!   errors classified; resync, retries, isolation, held sets and
//!   deletions are the reconciler's.
//! - [`SetShape`]: what an ipset type, family and header become in nft (key
//!   fields, `flags interval`, `size`), and members to elements and back;
//!   whatever nft cannot hold exactly is a typed error.
//! - [`interval`]: nomatch and overlapping networks as the exact disjoint
//!   address ranges ipset would match.
//! - [`Elements`]: a set's elements packed as the kernel's key bytes; desired
//!   and kernel state compare as bytes, operations borrow them.
//! - [`NftDataplane`]: typed operations, all of one apply in one nf_tables
//!   transaction, with typed errors naming the operation (and element).
//!   Backends: [`netlink::NetlinkNft`] (native NETLINK_NETFILTER),
//!   [`cli::CliNft`] (`nft -j`, the fallback and the tests' oracle) and
//!   `model::ModelNft` (feature `model`).
//!
//! Ownership: only sets whose names the caller's `owned` accepts are listed,
//! changed or deleted; chains, rules, maps, objects and other sets are never
//! touched; a missing table is created, and no table is ever deleted. This
//! crate must never depend on kube or tokio (it runs on the agent's kernel
//! thread, inside the node's network namespace). See docs/architecture.md
//! for the project's rules this follows.

#![forbid(unsafe_code)]

pub mod backend;
pub mod cli;
mod element;
pub mod interval;
#[cfg(feature = "model")]
pub mod model;
pub mod netlink;
mod shape;
mod spec;
mod value;

pub use element::{Element, ElementError, ElementRef, Elements, MAX_ELEMENT_COMMENT_LEN};
pub use shape::{SetShape, ShapeError, Unrepresentable, UnrepresentableMember};
pub use spec::{FieldType, KeyType, MAX_FIELDS, NftSetSpec};
pub use value::{Value, ValueError};

use std::fmt;

/// The address family of an nf_tables table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableFamily {
    Inet,
    Ip,
    Ip6,
    Arp,
    Bridge,
    Netdev,
}

impl TableFamily {
    pub const ALL: [TableFamily; 6] = [
        TableFamily::Inet,
        TableFamily::Ip,
        TableFamily::Ip6,
        TableFamily::Arp,
        TableFamily::Bridge,
        TableFamily::Netdev,
    ];

    /// The word `nft` uses (`table inet t`).
    pub fn nft_name(self) -> &'static str {
        match self {
            TableFamily::Inet => "inet",
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
            TableFamily::Arp => "arp",
            TableFamily::Bridge => "bridge",
            TableFamily::Netdev => "netdev",
        }
    }

    pub fn from_nft_name(s: &str) -> Option<TableFamily> {
        TableFamily::ALL.into_iter().find(|f| f.nft_name() == s)
    }

    /// NFPROTO_* of the family (the nfgenmsg family byte).
    pub(crate) fn nfproto(self) -> u8 {
        match self {
            TableFamily::Inet => 1,
            TableFamily::Ip => 2,
            TableFamily::Arp => 3,
            TableFamily::Netdev => 5,
            TableFamily::Bridge => 7,
            TableFamily::Ip6 => 10,
        }
    }
}

impl fmt::Display for TableFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.nft_name())
    }
}

/// The table this project's sets live in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Table {
    pub family: TableFamily,
    pub name: String,
}

impl Table {
    pub fn new(family: TableFamily, name: impl Into<String>) -> Table {
        Table {
            family,
            name: name.into(),
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// The longest table or set name nf_tables accepts (NFT_NAME_MAXLEN - 1).
pub const MAX_NAME_LEN: usize = 255;

/// Whether nf_tables and `nft`'s own syntax accept `name` as a table or
/// set name: 1 to 255 bytes of letters, digits, `_ - . /`, starting with a
/// letter (as nft's scanner reads an identifier; no quoting needed).
pub fn is_valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    first_ok
        && name.len() <= MAX_NAME_LEN
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
}

/// One typed operation. Operations borrow the caller's elements: a batch of
/// a million elements is never copied.
#[derive(Clone, Copy, Debug)]
pub enum NftOp<'a> {
    /// Create the table when it is missing (a no-op when it exists).
    EnsureTable,
    /// Create a set with `spec` (nft's `add set`): a no-op when it exists
    /// with the same key and flags (the kernel then takes the new size);
    /// [`NftError::SetExists`] when it exists with another key or flags.
    CreateSet { name: &'a str, spec: &'a NftSetSpec },
    /// Add elements; elements already present are not an error (their
    /// comment is kept). An overlap with another range is
    /// [`NftError::ElementExists`].
    AddElements {
        set: &'a str,
        elements: &'a Elements,
    },
    /// Delete elements (each exactly as it was added); a missing one is
    /// [`NftError::ElementMissing`], which fails the whole transaction.
    DelElements {
        set: &'a str,
        elements: &'a Elements,
    },
    /// Remove every element.
    FlushSet { set: &'a str },
    /// Delete the set; [`NftError::InUse`] while a rule references it. A
    /// map of that name is deleted too (it is a foreign shape of an owned
    /// set, which `read_set` reports with `map` in its `unmanaged`).
    DeleteSet { set: &'a str },
}

impl NftOp<'_> {
    /// The set the operation is about (`None` for the table).
    pub fn set(&self) -> Option<&str> {
        match self {
            NftOp::EnsureTable => None,
            NftOp::CreateSet { name, .. } => Some(name),
            NftOp::AddElements { set, .. }
            | NftOp::DelElements { set, .. }
            | NftOp::FlushSet { set }
            | NftOp::DeleteSet { set } => Some(set),
        }
    }
}

/// Every failure a backend reports, typed so that the caller can react
/// without reading text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NftError {
    #[error("table {0} does not exist")]
    TableMissing(String),
    #[error("set {0} does not exist")]
    SetMissing(String),
    #[error("set {0} already exists with another type or flags")]
    SetExists(String),
    #[error("set {0} is in use: a rule references it")]
    InUse(String),
    #[error("set {0} is full (its size is reached)")]
    SetFull(String),
    #[error("element {element} of set {set} overlaps an existing one")]
    ElementExists { set: String, element: String },
    #[error("element {element} of set {set} does not exist")]
    ElementMissing { set: String, element: String },
    #[error("the kernel rejected element {element} of set {set}: {reason}")]
    InvalidElement {
        set: String,
        element: String,
        reason: String,
    },
    /// A set this project does not own, or a name nf_tables cannot take.
    #[error("refused to touch {0}: not a set name this project owns")]
    NotOwned(String),
    #[error("elements of type {got} for set {set} of type {want}")]
    ElementType {
        set: String,
        got: KeyType,
        want: KeyType,
    },
    /// The kernel lacks what the operation needs (EOPNOTSUPP and friends).
    #[error("not supported by this kernel: {0}")]
    NotSupported(String),
    /// Could not talk to the kernel at all (socket, permission, `nft`
    /// missing). Transient: worth a retry.
    #[error("nf_tables unavailable: {0}")]
    Unavailable(String),
    /// An answer this crate does not understand.
    #[error("unexpected reply from nf_tables: {0}")]
    Protocol(String),
    /// The table carries nf_tables' `owner` flag for another process (the
    /// kernel then refuses every change by anyone else with EPERM, even to
    /// root).
    #[error(
        "table {table} is owned by another process ({owner}nf_tables flag `owner`): the kernel lets only that process change it; give ipsetmgr a table of its own (--nft-table)"
    )]
    TableOwned {
        table: String,
        /// `netlink port N, `, when the kernel says which.
        owner: String,
    },
    /// The batch was made against ruleset generation `expected`, and
    /// another transaction committed since: nothing was applied; read the
    /// sets again, then retry (docs/architecture.md, "Quiet resyncs").
    #[error(
        "the nf_tables ruleset changed since generation {expected}, which the transaction was made against: read again, then retry"
    )]
    GenerationMoved { expected: u32 },
    #[error("{0}")]
    Other(String),
}

/// A transaction that failed: nothing of it was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftBatchError {
    /// The operation that failed; `None` when the kernel refused the
    /// transaction as a whole (at its start or its commit).
    pub op_index: Option<usize>,
    /// Which of the operation's elements, when the kernel told.
    pub element_index: Option<usize>,
    pub error: NftError,
}

impl NftBatchError {
    pub(crate) fn whole(error: NftError) -> NftBatchError {
        NftBatchError {
            op_index: None,
            element_index: None,
            error,
        }
    }

    pub(crate) fn at(op_index: usize, error: NftError) -> NftBatchError {
        NftBatchError {
            op_index: Some(op_index),
            element_index: None,
            error,
        }
    }
}

impl fmt::Display for NftBatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op_index {
            Some(i) => write!(f, "operation {i} failed (nothing applied): {}", self.error),
            None => write!(f, "transaction refused (nothing applied): {}", self.error),
        }
    }
}

impl std::error::Error for NftBatchError {}

/// One set as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftKernelSet {
    pub name: String,
    /// The kernel's handle (0 from the model).
    pub handle: u64,
    /// `None` when the key is no type this crate creates: the caller
    /// replaces the set.
    pub spec: Option<NftSetSpec>,
    /// What this crate never sets, as nft would say it (`flags timeout`,
    /// `map`, `counter`, `policy memory`, ...): each changes what the set
    /// does, so any of them means the set is replaced.
    pub unmanaged: Vec<String>,
    /// `None` when `spec` is, and from the cli backend for a map (whose
    /// elements are key : data pairs; `unmanaged` says `map`).
    pub elements: Option<Elements>,
    /// Elements whose bytes do not fit the key (counted, not kept).
    pub unreadable_elements: usize,
    /// Rules of the table that look the set up (nf_tables has no set use
    /// count to report: this counts `@set` references in the rules).
    pub references: u32,
}

/// The typed interface to nf_tables sets in one table.
pub trait NftDataplane: Send {
    /// Short name for logs ("netlink", "cli", "model").
    fn name(&self) -> &'static str;

    /// All `ops` in one nf_tables transaction: all or nothing. Every set an
    /// op names must pass `owned`, or nothing is sent
    /// ([`NftError::NotOwned`]).
    fn apply(
        &mut self,
        table: &Table,
        ops: &[NftOp<'_>],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<(), NftBatchError>;

    /// Names of the table's sets for which `owned` is true (maps and
    /// anonymous sets never are); `Ok(None)` when the table does not exist.
    /// Reads no elements.
    fn list_sets(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, NftError>;

    /// One set's spec and elements as the kernel reports them; `Ok(None)`
    /// when the table or the set does not exist. The kernel backends report
    /// a map of that name too, with `map` in `unmanaged`: a shape to
    /// replace.
    fn read_set(&mut self, table: &Table, name: &str) -> Result<Option<NftKernelSet>, NftError>;

    /// Whether the table holds anything this project did not create:
    /// chains (and so rules), objects, flowtables, maps, sets `owned`
    /// refuses. `false` for a missing table.
    fn table_has_foreign_objects(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<bool, NftError>;

    /// The ruleset generation now (every committed transaction, ours or
    /// anyone's, moves it); `Ok(None)` when this backend cannot tell.
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        Ok(None)
    }

    /// Make the next batch against generation `generation` (the kernel
    /// refuses it with [`NftError::GenerationMoved`] when the ruleset moved
    /// since); `None`: unchecked. A backend that cannot check ignores it.
    fn expect_generation(&mut self, _generation: Option<u32>) {}

    /// The generation the caller's view of the ruleset is known to hold
    /// at: the one last given to [`NftDataplane::expect_generation`], moved
    /// on by each of our own batches that committed against it. `None`
    /// after any failure, or when this backend cannot tell.
    fn expected_generation(&self) -> Option<u32> {
        None
    }
}

impl<D: NftDataplane + ?Sized> NftDataplane for Box<D> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn apply(
        &mut self,
        table: &Table,
        ops: &[NftOp<'_>],
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<(), NftBatchError> {
        (**self).apply(table, ops, owned)
    }
    fn list_sets(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, NftError> {
        (**self).list_sets(table, owned)
    }
    fn read_set(&mut self, table: &Table, name: &str) -> Result<Option<NftKernelSet>, NftError> {
        (**self).read_set(table, name)
    }
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        (**self).generation()
    }
    fn expect_generation(&mut self, generation: Option<u32>) {
        (**self).expect_generation(generation)
    }
    fn expected_generation(&self) -> Option<u32> {
        (**self).expected_generation()
    }
    fn table_has_foreign_objects(
        &mut self,
        table: &Table,
        owned: &dyn Fn(&str) -> bool,
    ) -> Result<bool, NftError> {
        (**self).table_has_foreign_objects(table, owned)
    }
}

/// The checks every backend makes before it sends anything: valid names,
/// owned sets, elements of the type of a set created in the same batch.
pub(crate) fn precheck(
    table: &Table,
    ops: &[NftOp<'_>],
    owned: &dyn Fn(&str) -> bool,
) -> Result<(), NftBatchError> {
    if !is_valid_name(&table.name) {
        return Err(NftBatchError::whole(NftError::NotOwned(format!(
            "table {table} (not a valid table name)"
        ))));
    }
    let mut created: Vec<(&str, &NftSetSpec)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(set) = op.set()
            && (!is_valid_name(set) || !owned(set))
        {
            return Err(NftBatchError::at(
                i,
                NftError::NotOwned(format!("set {set}")),
            ));
        }
        match op {
            NftOp::CreateSet { name, spec } => created.push((name, spec)),
            NftOp::AddElements { set, elements } | NftOp::DelElements { set, elements } => {
                if let Some((_, spec)) = created.iter().rev().find(|(n, _)| n == set)
                    && (spec.key != elements.key_type() || spec.interval != elements.has_ranges())
                {
                    return Err(NftBatchError::at(
                        i,
                        NftError::ElementType {
                            set: set.to_string(),
                            got: elements.key_type(),
                            want: spec.key,
                        },
                    ));
                }
            }
            NftOp::DeleteSet { set } => created.retain(|(n, _)| n != set),
            _ => {}
        }
    }
    Ok(())
}
