//! The kernel seam: what one kernel's adapter does for the reconciler.
//!
//! The reconciler ([`Reconciler`](crate::Reconciler)) owns the life of
//! every set: when to resync, retries with backoff, isolation of a set that
//! keeps failing, held sets, deletions and reports. An adapter owns only
//! what its kernel alone knows: its names, what it believes the kernel
//! holds for a set (its [`Kernel::Set`]), how a set is written (ipset's
//! temp set and swap, nf_tables' one transaction) and how its errors map to
//! sets. It never decides whether to retry, isolate or delete.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use ipsetmgr_ipset::{Member, Naming};

use crate::{BackendId, DesiredSet, Drift, KernelError, ListedSet, SetError, WriteKind};

/// Every desired set by kernel name, with the reconciler's bookkeeping.
pub type Sets<S> = BTreeMap<String, Entry<S>>;

/// One desired set: the adapter's content and belief (`set`), and what the
/// reconciler keeps about it.
#[derive(Clone, Debug)]
pub struct Entry<S> {
    pub set: S,
    pub(crate) policy: String,
    pub(crate) drift: Drift,
    pub(crate) failure: Option<crate::Failure>,
    pub(crate) last_sync: Option<std::time::SystemTime>,
    /// What the kernel holds of it is not known (never read, or a failed
    /// batch made it unknown): a resync that reads nothing else reads it.
    pub(crate) needs_read: bool,
}

impl<S> Entry<S> {
    pub fn policy(&self) -> &str {
        &self.policy
    }
}

/// What an adapter may look at while it derives a set's kernel form: the
/// whole desired state (a list:set is made of the sets it lists).
pub struct Context<'a> {
    /// Every desired set, by its name in the project's naming.
    pub desired: &'a HashMap<&'a str, &'a DesiredSet>,
    /// Policies that failed to load: their sets stay as they are.
    pub held_policies: &'a HashSet<String>,
}

/// An owned set the kernel lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    pub name: String,
    /// The leftover of an interrupted write (an ipset temp set): always
    /// removed, whatever the desired state.
    pub leftover: bool,
}

/// How the due sets are to be written, in batch order, and the sets that
/// cannot be written (isolated by the reconciler without a kernel round trip).
#[derive(Debug, Default)]
pub struct Planned {
    pub writes: Vec<(String, WriteKind)>,
    pub refused: Vec<(String, SetError)>,
}

/// A batch the kernel refused, mapped to sets.
#[derive(Clone, Debug)]
pub struct BatchFailure {
    pub error: KernelError,
    /// The set whose operation failed, when the kernel says.
    pub set: Option<String>,
    /// The element that failed, when the kernel says.
    pub element: Option<Member>,
    /// The error is a property of that set (isolate it now, not after
    /// repeats).
    pub about_set: bool,
    /// Sets whose kernel content is no longer known: read again before the
    /// next try (not drift).
    pub reread: Vec<String>,
    /// Sets the failed batch wrote before it stopped, and how.
    pub partly_written: Vec<(String, WriteKind)>,
    /// Leftovers the failed batch made (temp sets) to remove.
    pub leftovers: Vec<String>,
}

/// One kernel's adapter. `Send` because the node drives it on a thread of
/// its own, inside the target network namespace.
pub trait Kernel: Send {
    /// What the adapter keeps per desired set: the set's kernel form and
    /// what it believes the kernel holds.
    type Set: Send;
    /// One set as the kernel reports it.
    type Read;

    fn id(&self) -> BackendId;

    fn naming(&self) -> &Naming;

    /// The kernel's name for a desired set: by default the project's own
    /// (ipset names, BPF pins); nft maps it into its table.
    fn kernel_name(&self, desired: &DesiredSet) -> String {
        desired.name.clone()
    }

    /// Every name the sets of `policy` may have in this kernel (one per
    /// family): a held policy's sets are left alone. By default the
    /// project's own names, as [`kernel_name`](Kernel::kernel_name).
    fn policy_names(&self, policy: &str) -> Vec<String> {
        self.naming().main_set_names(policy).into()
    }

    /// The owned sets in the kernel (never a foreign one).
    fn list_owned(&mut self) -> Result<Vec<Owned>, KernelError>;

    /// One owned set; `None` when absent.
    fn read(&mut self, name: &str) -> Result<Option<Self::Read>, KernelError>;

    /// A full resync starts: forget what failed batches taught (a kernel
    /// module may have been loaded since).
    fn forget_learned(&mut self) {}

    /// A full resync is due: whether the kernel is known not to have
    /// changed since this adapter's own last full read or write, so the
    /// resync may keep what it believes and list and read nothing (only
    /// sets never read). The default, `false`, always reads; nf_tables
    /// compares its ruleset generation (docs/architecture.md, "Quiet
    /// resyncs").
    fn unchanged_since_last_read(&mut self) -> bool {
        false
    }

    /// A full resync listed and read every owned set without an error:
    /// what the adapter believes is the kernel's state as of the resync's
    /// start.
    fn full_read_done(&mut self) {}

    /// The adapter's state for a newly desired set (kernel unknown).
    fn new_set(&mut self, name: &str, desired: &DesiredSet, cx: &Context<'_>) -> Self::Set;

    /// A new desired state for a known set; returns whether its content
    /// changed (a new try is due, whatever failed before).
    fn update_set(
        &mut self,
        set: &mut Self::Set,
        name: &str,
        desired: &DesiredSet,
        cx: &Context<'_>,
    ) -> bool;

    /// The kernel is known not to hold the set.
    fn believe_absent(&self, set: &mut Self::Set);

    /// Take the kernel's word for a set; the differences to what was
    /// believed (to what is desired, on a first read) are the drift.
    fn absorb(&self, name: &str, set: &mut Self::Set, read: Option<Self::Read>) -> Drift;

    /// Whether the kernel is believed to hold the set as desired.
    fn in_sync(&self, set: &Self::Set) -> bool;

    fn member_count(&self, set: &Self::Set) -> usize;

    /// Before each try, after any resync: adjust sets to what the kernel
    /// holds of held policies (a list:set cannot list a missing set).
    fn before_writes(
        &mut self,
        _sets: &mut Sets<Self::Set>,
        _held_names: &HashSet<String>,
        _existing: &BTreeSet<String>,
    ) {
    }

    /// How to write `due` (sets not in sync, not waiting), in batch order.
    fn plan(&mut self, sets: &mut Sets<Self::Set>, due: Vec<String>) -> Planned;

    /// Send one batch of `writes` (from [`Kernel::plan`]).
    fn write(
        &mut self,
        sets: &mut Sets<Self::Set>,
        writes: &[(String, WriteKind)],
    ) -> Result<(), Box<BatchFailure>>;

    /// The batch holding the set succeeded: the kernel holds it as desired.
    fn committed(&self, set: &mut Self::Set);

    /// Delete `names`; one result per name, in order.
    fn delete(&mut self, names: &[String]) -> Vec<Result<(), KernelError>>;

    /// One line of `--dry-run` for a set not in sync.
    fn describe(&mut self, sets: &Sets<Self::Set>, name: &str) -> String;

    /// The verb `--dry-run` uses for a set deletion ("destroy", "delete").
    fn deletion_verb(&self) -> &'static str {
        "delete"
    }

    /// Every owned set in the kernel (`ipsetmgr sets`), read only.
    fn list(&mut self) -> Result<Vec<ListedSet>, KernelError>;

    /// How a user is shown the set `name` (an nft set after its table).
    fn shown_name(&self, name: &str) -> String {
        name.to_string()
    }

    /// After each apply (the ipset adapter returns freed memory).
    fn after_apply(&mut self) {}
}
