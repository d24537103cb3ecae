//! The command line: every flag, its environment variable and its default,
//! each defined once (the chart and the docs use the same names).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::commands::slice::{self, OutputFormat, parse_policy_name};
use ipsetmgr_agent::node_state::Pacing;
use ipsetmgr_cluster::logging::LogFormat;
use ipsetmgr_cluster::slices::ClusterLimits;
use ipsetmgr_feeds::egress::{Cidr, EgressGuard, Setting as EgressSetting};
use ipsetmgr_filemode::{apply, run};
use ipsetmgr_ipset::{Naming, SetType};
use ipsetmgr_nft::TableFamily;
use ipsetmgr_node::{BackendList, KernelOptions, parse_table_family, parse_table_name};
use ipsetmgr_policy::FamilySpec;
use ipsetmgr_policy::compile::{MAX_HASH_SIZE, MAX_MAX_ELEM, MIN_HASH_SIZE};
use ipsetmgr_policy::duration;
use ipsetmgr_policy::member_list::ListFormat;

/// Defaults shared by several flags, the chart and the docs.
pub mod defaults {
    /// Between full resyncs against the kernel.
    pub const RESYNC_INTERVAL: &str = "60s";
    /// The agent's /metrics listener.
    pub const LISTEN: &str = "0.0.0.0:9477";
    /// The agent's /healthz, /livez and /readyz listener: localhost, which
    /// the agent (hostNetwork) shares with the kubelet that probes it.
    pub const HEALTH_LISTEN: &str = "127.0.0.1:9476";
    /// The controller's /metrics listener.
    pub const CONTROLLER_LISTEN: &str = "0.0.0.0:9478";
    /// The controller's health listener: not localhost, which the kubelet
    /// cannot reach in the controller's own pod network.
    pub const CONTROLLER_HEALTH_LISTEN: &str = "0.0.0.0:9479";
    /// The namespace the agent and controller run in (their Lease, Events).
    pub const NAMESPACE: &str = "ipsetmgr-system";
    /// How long a writer waits for another writer's lock.
    pub const LOCK_WAIT: &str = "30s";
    /// Between heartbeats of a node's IPSetNodeState.
    pub const HEARTBEAT_INTERVAL: &str = "60s";
}

#[derive(Parser)]
#[command(
    name = "ipsetmgr",
    version,
    about = "Keeps Linux ipsets equal to declared IPSetPolicies"
)]
pub struct Cli {
    /// Run the kernel side inside this named network namespace (created
    /// when missing), so the host's own firewall is never touched. Only the
    /// kernel side moves: the API client and listeners stay where they are.
    #[arg(long, global = true, value_name = "NAME")]
    pub netns: Option<String>,
    /// Prefix of the kernel sets this tool owns (1-8 letters or digits).
    #[arg(long, global = true, env = "IPSETMGR_SET_PREFIX", default_value = ipsetmgr_ipset::Naming::DEFAULT_PREFIX)]
    pub set_prefix: String,
    /// Kernel backends, comma-separated: ipsets over `netlink` (native, the
    /// default; falls back to cli when the kernel lacks it) or `cli` (the
    /// `ipset` binary); nf_tables named sets over `nft` (native netlink) or
    /// `nft-cli` (`nft -j`); pinned BPF prefix maps with `bpf` (hash:ip and
    /// hash:net only; docs/bpf.md). `netlink,nft` holds each set as an
    /// ipset and as an nft set (`both` is the same).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_BACKEND",
        value_name = "LIST",
        default_value = "netlink",
        value_parser = parse_backend_list
    )]
    pub backend: BackendList,
    /// The family of the nft table the nft backends keep their sets in (a
    /// rule can match only sets of its own table).
    #[arg(long, global = true, env = "IPSETMGR_NFT_FAMILY", value_parser = parse_table_family, default_value = "inet")]
    pub nft_family: TableFamily,
    /// The nft table the nft backends keep their sets in: created when
    /// missing, never deleted; only its sets named with the prefix are
    /// touched (chains, rules, maps and other sets never).
    #[arg(long, global = true, env = "IPSETMGR_NFT_TABLE", value_parser = parse_table_name, default_value = "ipsetmgr")]
    pub nft_table: String,
    /// The bpffs the bpf backend keeps its sets in, as pins under
    /// `<path>/ipsetmgr/` (mounted when nothing is mounted there).
    #[arg(long, global = true, env = "IPSETMGR_BPF_PATH", value_name = "PATH", default_value = ipsetmgr_bpf::DEFAULT_MOUNT)]
    pub bpf_path: std::path::PathBuf,
    /// Log format on stderr.
    #[arg(long, global = true, env = "IPSETMGR_LOG_FORMAT", value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
    /// How long a command that writes to the kernel waits for another
    /// ipsetmgr writing the same prefix in this network namespace (0: fail at
    /// once).
    #[arg(
        long,
        global = true,
        env = "IPSETMGR_LOCK_WAIT",
        value_name = "DURATION",
        default_value = defaults::LOCK_WAIT,
        value_parser = duration::parse_duration
    )]
    pub lock_wait: Duration,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// What the global flags say of the kernel side.
    pub fn kernel_options(&self, naming: Naming) -> KernelOptions {
        KernelOptions {
            netns: self.netns.clone(),
            backend: self.backend.clone(),
            nft_table: ipsetmgr_nft::Table::new(self.nft_family, self.nft_table.clone()),
            bpf_path: self.bpf_path.clone(),
            naming,
            lock_wait: self.lock_wait,
            retire_other_backend: false,
        }
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Reconcile the kernel once with the policies in files or directories.
    Apply(ApplyFlags),
    /// Keep the kernel in line with a policy directory: react to file
    /// changes and SIGHUP, resync periodically.
    Run(RunFlags),
    /// List the owned sets in this kernel with their counts.
    Sets,
    /// Run the per-node Kubernetes agent (normally as a DaemonSet).
    Agent(AgentConfig),
    /// Run the cluster's controller (normally a small Deployment): policy
    /// validation and status, from the nodes' states.
    Controller(ControllerConfig),
    /// Run many hollow agents in this process (the real agent code, with
    /// the in-memory kernel model), each with a Node object of its own: for
    /// measuring the control plane at scale (scripts/scale.py).
    Hollow(HollowConfig),
    /// Print the CustomResourceDefinitions (IPSetPolicy, IPSetMemberSlice,
    /// IPSetNodeState) as one YAML stream.
    Crd,
    /// Turn a member list (FireHOL netset, Spamhaus DROP, YAML or JSON)
    /// into IPSetMemberSlice objects for one policy, printed as a YAML
    /// stream for `kubectl apply -f -`. A member's slice is chosen by a hash
    /// of the member, so a small change to the list changes few slices.
    Slice(SliceFlags),
    /// Attach ipsetmgr's XDP program to an interface (in --netns) to drop
    /// packets whose source address the named policies' BPF sets match
    /// (kept by --backend bpf under --bpf-path), or detach it.
    #[command(subcommand)]
    Xdp(XdpAction),
}

/// `ipsetmgr xdp ...`.
#[derive(Debug, Subcommand)]
pub enum XdpAction {
    /// Attach the program: one per interface, up to 4 IPv4 and 4 IPv6
    /// sets. Later changes to the sets take effect without attaching again.
    Attach {
        /// The interface, in the target network namespace.
        #[arg(long, value_name = "IF")]
        interface: String,
        /// Policies whose BPF sets (IPv4 and IPv6, those that exist) say
        /// which sources to drop (repeatable, or several after one flag).
        #[arg(long = "drop-from", value_name = "POLICY", required = true, num_args = 1..)]
        drop_from: Vec<String>,
    },
    /// Detach the program; the sets stay.
    Detach {
        #[arg(long, value_name = "IF")]
        interface: String,
    },
}

/// Flags of `ipsetmgr apply`.
#[derive(Debug, clap::Args)]
pub struct ApplyFlags {
    /// Policy file or directory (repeatable).
    #[arg(
        short = 'f',
        long = "filename",
        required = true,
        value_name = "FILE|DIR"
    )]
    pub paths: Vec<PathBuf>,
    /// Print the planned operations without changing the kernel.
    #[arg(long)]
    pub dry_run: bool,
    /// Also delete owned sets that no given policy wants.
    #[arg(long)]
    pub prune: bool,
    /// Add a plain member list (FireHOL netset, Spamhaus DROP: one
    /// member per line, `#` comments; or YAML/JSON) to a policy's
    /// members, as a slice would (repeatable).
    #[arg(long = "members", value_name = "POLICY=FILE", value_parser = parse_members_file)]
    pub members: Vec<ipsetmgr_filemode::files::MembersFile>,
    #[command(flatten)]
    pub labels: NodeLabels,
    #[command(flatten)]
    pub egress: FeedEgress,
}

impl ApplyFlags {
    /// What `apply` is asked to do.
    pub(crate) fn into_args(self) -> apply::ApplyArgs {
        apply::ApplyArgs {
            paths: self.paths,
            members: self.members,
            dry_run: self.dry_run,
            prune: self.prune,
            labels: self.labels.labels(),
            egress: self.egress.guard(EgressSetting::Files),
        }
    }
}

/// Flags of `ipsetmgr run`.
#[derive(Debug, clap::Args)]
pub struct RunFlags {
    /// Directory of policy files (*.yaml, *.yml, *.json), watched for changes
    #[arg(long, value_name = "DIR")]
    pub policy_dir: PathBuf,
    #[command(flatten)]
    pub resync: Resync,
    #[command(flatten)]
    pub labels: NodeLabels,
    #[command(flatten)]
    pub egress: FeedEgress,
}

impl RunFlags {
    /// What `run` is asked to do.
    pub(crate) fn into_args(self) -> run::RunArgs {
        run::RunArgs {
            policy_dir: self.policy_dir,
            resync_interval: self.resync.interval,
            labels: self.labels.labels(),
            egress: self.egress.guard(EgressSetting::Files),
            build: (
                ipsetmgr_cluster::telemetry::build_info::VERSION,
                ipsetmgr_cluster::telemetry::build_info::REVISION,
            ),
        }
    }
}

/// Flags of `ipsetmgr slice`.
#[derive(Debug, clap::Args)]
pub struct SliceFlags {
    /// The policy the slices belong to (their `ipsetmgr.io/policy`
    /// label; at most 63 characters).
    #[arg(long, value_name = "NAME", value_parser = parse_policy_name)]
    pub policy: String,
    /// The member list: one member per line (`#` and ` ;` start
    /// comments), or YAML/JSON (`*.yaml`, `*.yml`, `*.json`): a list of
    /// strings or a mapping with `members:`. `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub input: PathBuf,
    /// The most members of one slice, 1 to 50000 (slices are also kept
    /// under 200000 bytes of JSON). The default keeps what a 10-member
    /// change of a million-member list sends each node under 100 kB
    /// (docs/scaling.md, "Slice size").
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=50000))]
    pub max_members: u32,
    /// Parse every member as this set type (any hash:* or bitmap:* type)
    /// and write it in canonical form (a bitmap's range is checked when
    /// the policy is compiled). Without
    /// it, members are checked only against the CRD's per-member schema
    /// (printable ASCII without spaces, an optional " nomatch" and
    /// " comment:TEXT", at most 400 characters) and written as given.
    #[arg(long = "type", value_name = "TYPE", value_parser = parse_slice_type)]
    pub set_type: Option<SetType>,
    /// The policy's family, with --type: IPv4 (default), IPv6 or Dual.
    /// Members of another family are errors.
    #[arg(long, value_name = "FAMILY", requires = "set_type", value_parser = parse_family)]
    pub family: Option<FamilySpec>,
    /// Write the slices to this file (a regular or new file: complete or
    /// not at all, its mode and owner kept) instead of standard output. A
    /// device, FIFO or socket is written as it is; a symlink is followed.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// A YAML stream of the slices, or one JSON `v1` `List`.
    #[arg(long, value_enum, default_value_t = OutputFormat::Yaml)]
    pub output_format: OutputFormat,
    /// The member list's syntax, instead of what its name implies
    /// (standard input: text).
    #[arg(long, value_name = "FORMAT", value_parser = list_format())]
    pub format: Option<ListFormat>,
}

impl SliceFlags {
    /// What `slice` is asked to do.
    pub(crate) fn into_args(self) -> slice::SliceArgs {
        let check = match self.set_type {
            Some(set_type) => slice::Check::Typed {
                set_type,
                family: self.family.unwrap_or_default(),
            },
            None => slice::Check::Schema,
        };
        slice::SliceArgs {
            policy: self.policy,
            input: self.input,
            input_format: self.format,
            check,
            max_members: self.max_members as usize,
            output: self.output,
            output_format: self.output_format,
        }
    }
}

/// Flags of `ipsetmgr agent` (the global flags set the kernel side).
#[derive(Clone, Debug, clap::Args)]
pub struct AgentConfig {
    /// This node's name (from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Kubeconfig file; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub resync: Resync,
    /// Address of the /metrics listener.
    #[arg(long, env = "IPSETMGR_LISTEN", default_value = defaults::LISTEN)]
    pub listen: SocketAddr,
    /// Address of the /healthz, /livez and /readyz listener (the same as
    /// --listen: one listener serves all).
    #[arg(long, env = "IPSETMGR_HEALTH_LISTEN", default_value = defaults::HEALTH_LISTEN)]
    pub health_listen: SocketAddr,
    /// Time between heartbeats of this node's IPSetNodeState: the
    /// controller counts a node whose heartbeat is older than three of
    /// these as not synced.
    #[arg(long, env = "IPSETMGR_HEARTBEAT_INTERVAL", default_value = defaults::HEARTBEAT_INTERVAL, value_parser = ipsetmgr_policy::duration::parse_positive)]
    pub heartbeat_interval: Duration,
    #[command(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    pub node_state: NodeStatePacing,
    #[command(flatten)]
    pub xdp: AgentXdp,
}

/// The agent's XDP option (docs/bpf.md, "The XDP program in the agent"):
/// both flags or neither; only with `--backend` listing `bpf`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct AgentXdp {
    /// Keep ipsetmgr's XDP program attached to this interface (in --netns),
    /// dropping packets from the --xdp-drop-from policies' BPF sets.
    #[arg(
        long = "xdp-interface",
        env = "IPSETMGR_XDP_INTERFACE",
        value_name = "IF",
        requires = "xdp_drop_from"
    )]
    pub xdp_interface: Option<String>,
    /// Policies whose BPF sets the program drops sources from (repeatable,
    /// or a comma-separated list; up to 4 IPv4 and 4 IPv6 sets).
    #[arg(
        long = "xdp-drop-from",
        env = "IPSETMGR_XDP_DROP_FROM",
        value_name = "POLICY",
        value_delimiter = ',',
        requires = "xdp_interface"
    )]
    pub xdp_drop_from: Vec<String>,
}

/// Flags of `ipsetmgr controller`.
#[derive(Clone, Debug, clap::Args)]
pub struct ControllerConfig {
    /// Kubeconfig file; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the /metrics listener.
    #[arg(long, env = "IPSETMGR_LISTEN", default_value = defaults::CONTROLLER_LISTEN)]
    pub listen: SocketAddr,
    /// Address of the /healthz, /livez and /readyz listener (the same as
    /// --listen: one listener serves all).
    #[arg(long, env = "IPSETMGR_HEALTH_LISTEN", default_value = defaults::CONTROLLER_HEALTH_LISTEN)]
    pub health_listen: SocketAddr,
    /// Namespace of the controller's Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = defaults::NAMESPACE)]
    pub namespace: String,
    /// This replica's identity in the Lease (defaults to the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    #[command(flatten)]
    pub egress: FeedEgress,
    #[command(flatten)]
    pub limits: Limits,
    /// A policy status change of counts and messages only is written at
    /// most once per this interval (a change of its conditions at once):
    /// every status write reaches every agent.
    #[arg(long, env = "IPSETMGR_STATUS_SUMMARY_INTERVAL", default_value = "10s", value_parser = ipsetmgr_policy::duration::parse_positive)]
    pub status_summary_interval: Duration,
}

/// `ipsetmgr hollow`.
#[derive(Clone, Debug, clap::Args)]
pub struct HollowConfig {
    /// How many hollow agents (and Node objects) to run.
    #[arg(long)]
    pub nodes: usize,
    /// Kubeconfig file; in-cluster configuration (or $KUBECONFIG) when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The Nodes are named `<prefix>-<i>`.
    #[arg(long, default_value = "hollow")]
    pub name_prefix: String,
    /// Between heartbeats of each node's IPSetNodeState.
    #[arg(long, default_value = "60s", value_parser = ipsetmgr_policy::duration::parse_positive)]
    pub heartbeat_interval: Duration,
    /// Between full resyncs of each agent against its model kernel.
    #[arg(long, default_value = "10m", value_parser = ipsetmgr_policy::duration::parse_positive)]
    pub resync_interval: Duration,
    #[command(flatten)]
    pub node_state: NodeStatePacing,
    #[command(flatten)]
    pub limits: Limits,
}

/// `--backend`: the words are the node crate's registry
/// (`ipsetmgr_node::KernelBackend`), so a new backend is added there alone.
fn parse_backend_list(s: &str) -> Result<BackendList, String> {
    s.parse()
        .map_err(|e: ipsetmgr_node::BackendListError| e.to_string())
}

/// Log formats on stderr (`ipsetmgr_cluster::logging::LogFormat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl From<LogFormatArg> for LogFormat {
    fn from(f: LogFormatArg) -> LogFormat {
        match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

/// This cluster's own caps on what a policy may ask of every node's kernel
/// (`ipsetmgr_cluster::slices::ClusterLimits`; the agents and the
/// controller take the same values, from the chart's `limits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct Limits {
    /// The largest `maxElem` a policy may have in this cluster (at most the
    /// CRD's maximum, 16777216); a policy above it is invalid and held. A
    /// set without `maxElem` grows with its members up to it.
    #[arg(long = "max-set-elements", env = "IPSETMGR_MAX_SET_ELEMENTS", default_value_t = MAX_MAX_ELEM, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_MAX_ELEM)))]
    pub max_elem: u32,
    /// The largest `hashSize` a policy may have in this cluster (at most
    /// the CRD's maximum, 1048576: 8 MiB of kernel memory per set).
    #[arg(long = "max-hash-size", env = "IPSETMGR_MAX_HASH_SIZE", default_value_t = MAX_HASH_SIZE, value_parser = clap::value_parser!(u32).range(i64::from(MIN_HASH_SIZE)..=i64::from(MAX_HASH_SIZE)))]
    pub hash_size: u32,
}

impl From<Limits> for ClusterLimits {
    fn from(l: Limits) -> ClusterLimits {
        ClusterLimits {
            max_elem: l.max_elem,
            hash_size: l.hash_size,
        }
    }
}

/// `--node-state-interval` (`ipsetmgr_agent::node_state::Pacing`).
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct NodeStatePacing {
    /// At most one node-state write per this interval; what changes in
    /// between is written together (the latest state wins). A change is
    /// written once it has been quiet this long (the slices of a change
    /// that trickles in come sooner), at most eight intervals after it came.
    #[arg(id = "node_state_interval", long = "node-state-interval", value_name = "DURATION", env = "IPSETMGR_NODE_STATE_INTERVAL", default_value = "5s", value_parser = ipsetmgr_policy::duration::parse_positive)]
    pub interval: Duration,
}

impl From<NodeStatePacing> for Pacing {
    fn from(p: NodeStatePacing) -> Pacing {
        Pacing {
            interval: p.interval,
        }
    }
}

/// `--type` of `slice`: a hash type. list:set members name other policies,
/// which slices do not carry.
fn parse_slice_type(s: &str) -> Result<SetType, String> {
    match s.parse::<SetType>() {
        Ok(SetType::ListSet) => Err(
            "list:set is not sliced (its members are names of other policies); use a hash:* or bitmap:* type".into(),
        ),
        Ok(t) => Ok(t),
        Err(e) => Err(e.to_string()),
    }
}

/// `--format` of `slice`: the member list's syntax (`ListFormat` is the
/// policy crate's, which has no clap; the values and their help are its).
fn list_format() -> impl clap::builder::TypedValueParser<Value = ListFormat> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("text").help("One member per line; `#` and ` ;` start comments"),
        PossibleValue::new("yaml")
            .help("A YAML sequence of strings, or a mapping with a `members:` sequence"),
        PossibleValue::new("json")
            .help("A JSON array of strings, or an object with a `members` array"),
    ])
    .map(|s| match s.as_str() {
        "yaml" => ListFormat::Yaml,
        "json" => ListFormat::Json,
        _ => ListFormat::Text,
    })
}

/// `--family`, spelled as in a policy's `spec.family` (any case).
fn parse_family(s: &str) -> Result<FamilySpec, String> {
    [FamilySpec::IPv4, FamilySpec::IPv6, FamilySpec::Dual]
        .into_iter()
        .find(|f| format!("{f:?}").eq_ignore_ascii_case(s))
        .ok_or_else(|| format!("unknown family {s:?} (expected IPv4, IPv6 or Dual)"))
}

/// Where `url` sources may connect: `--feed-allow-cidr`, `--feed-deny-cidr`
/// (the controller, `apply` and `run`; docs/member-sources.md, "Egress").
#[derive(Clone, Debug, Default, clap::Args)]
pub struct FeedEgress {
    /// Let url sources connect to this range, which the egress guard
    /// refuses by default (private, loopback, link-local, ...); repeatable
    /// or comma-separated. The API server's own addresses need a CIDR that
    /// names exactly that address.
    #[arg(long = "feed-allow-cidr", env = "IPSETMGR_FEED_ALLOW_CIDRS", value_delimiter = ',', value_name = "CIDR", value_parser = Cidr::parse)]
    pub allow: Vec<Vec<Cidr>>,
    /// Never let url sources connect to this range, whatever else allows it;
    /// repeatable or comma-separated.
    #[arg(long = "feed-deny-cidr", env = "IPSETMGR_FEED_DENY_CIDRS", value_delimiter = ',', value_name = "CIDR", value_parser = Cidr::parse)]
    pub deny: Vec<Vec<Cidr>>,
}

impl FeedEgress {
    /// The guard these flags make, with the defaults of `setting`.
    pub fn guard(&self, setting: EgressSetting) -> EgressGuard {
        let flat = |v: &[Vec<Cidr>]| v.iter().flatten().copied().collect::<Vec<_>>();
        EgressGuard::new(setting, &flat(&self.allow), &flat(&self.deny))
    }
}

/// `--resync-interval`, for every command with a driver loop.
#[derive(Clone, Debug, clap::Args)]
pub struct Resync {
    /// Time between full resyncs against the kernel (60, 60s, 5m, 1h30m).
    #[arg(long = "resync-interval", env = "IPSETMGR_RESYNC_INTERVAL", default_value = defaults::RESYNC_INTERVAL, value_parser = duration::parse_positive)]
    pub interval: Duration,
}

/// `--node-label` for file mode: the labels nodeSelectors are matched to.
#[derive(Clone, Debug, clap::Args)]
pub struct NodeLabels {
    /// Evaluate nodeSelectors against this label (repeatable, KEY=VALUE);
    /// without any, selectors are ignored.
    #[arg(long = "node-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub pairs: Vec<(String, String)>,
}

impl NodeLabels {
    /// `None` without labels: selectors are ignored.
    pub fn labels(&self) -> Option<BTreeMap<String, String>> {
        (!self.pairs.is_empty()).then(|| self.pairs.iter().cloned().collect())
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err("label key is empty".into());
    }
    Ok((k.to_string(), v.to_string()))
}

/// `POLICY=FILE`: the policy a member list belongs to, and the list's path.
fn parse_members_file(s: &str) -> Result<ipsetmgr_filemode::files::MembersFile, String> {
    let (policy, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected POLICY=FILE"))?;
    if policy.is_empty() || path.is_empty() {
        return Err(format!("{s:?}: expected POLICY=FILE, both non-empty"));
    }
    Ok(ipsetmgr_filemode::files::MembersFile {
        policy: policy.to_string(),
        path: PathBuf::from(path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let cli = Cli::try_parse_from(["ipsetmgr", "run", "--policy-dir", "/d"]).unwrap();
        assert_eq!(cli.set_prefix, "ipm");
        assert_eq!(cli.lock_wait, Duration::from_secs(30));
        assert_eq!(cli.bpf_path, std::path::Path::new("/sys/fs/bpf"));
        let Command::Run(RunFlags { resync, labels, .. }) = cli.command else {
            panic!("run")
        };
        assert_eq!(resync.interval, Duration::from_secs(60));
        assert_eq!(labels.labels(), None);
        assert!(Cli::try_parse_from(["ipsetmgr", "--lock-wait", "0", "sets"]).is_ok());
        assert!(Cli::try_parse_from(["ipsetmgr", "--backend", "iptables", "sets"]).is_err());
        for (words, parsed) in [
            ("netlink,nft", "netlink,nft"),
            ("both", "netlink,nft"),
            ("nft-cli, cli", "nft-cli,cli"),
            ("netlink,bpf", "netlink,bpf"),
            ("both,bpf", "netlink,nft,bpf"),
        ] {
            let cli = Cli::try_parse_from(["ipsetmgr", "--backend", words, "sets"]).unwrap();
            assert_eq!(cli.backend.to_string(), parsed);
        }
        // Two backends of one kind would own the same sets.
        for refused in ["netlink,cli", "nft,nft", "netlink,", "both,nft", "bpf,bpf"] {
            assert!(
                Cli::try_parse_from(["ipsetmgr", "--backend", refused, "sets"]).is_err(),
                "{refused}"
            );
        }
        assert!(
            Cli::try_parse_from(["ipsetmgr", "apply", "-f", "x", "--node-label", "=v"]).is_err()
        );
    }

    fn agent(extra: &[&str]) -> Result<AgentConfig, clap::Error> {
        let mut argv = vec!["ipsetmgr", "agent", "--node-name", "n"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Agent(config) => Ok(config),
            _ => panic!("agent"),
        }
    }

    #[test]
    fn agent_xdp_flags_come_both_or_neither() {
        let none = agent(&[]).unwrap();
        assert_eq!(none.xdp.xdp_interface, None);
        assert!(none.xdp.xdp_drop_from.is_empty());
        let both = agent(&[
            "--xdp-interface",
            "eth0",
            "--xdp-drop-from",
            "a,b",
            "--xdp-drop-from",
            "c",
        ])
        .unwrap();
        assert_eq!(both.xdp.xdp_interface.as_deref(), Some("eth0"));
        assert_eq!(both.xdp.xdp_drop_from, ["a", "b", "c"]);
        assert!(agent(&["--xdp-interface", "eth0"]).is_err());
        assert!(agent(&["--xdp-drop-from", "a"]).is_err());
    }

    fn slice(extra: &[&str]) -> Result<Command, clap::Error> {
        let base = ["ipsetmgr", "slice", "--policy", "blocklist", "-f", "-"];
        Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.command)
    }

    #[test]
    fn slice_flags_parse_and_refuse_what_cannot_be_sliced() {
        let Command::Slice(SliceFlags {
            max_members,
            set_type,
            family,
            output_format,
            format,
            ..
        }) = slice(&[]).unwrap()
        else {
            panic!("slice")
        };
        assert_eq!((max_members, set_type, family), (500, None, None));
        assert_eq!((output_format, format), (OutputFormat::Yaml, None));
        let Command::Slice(SliceFlags {
            set_type, family, ..
        }) = slice(&["--type", "hash:net", "--family", "dual"]).unwrap()
        else {
            panic!("slice")
        };
        assert_eq!(
            (set_type, family),
            (Some(SetType::HashNet), Some(FamilySpec::Dual))
        );
        for bad in [
            &["--type", "list:set"][..],
            &["--type", "hash:foo"],
            &["--family", "IPv6"],
            &["--type", "hash:ip", "--family", "v7"],
            &["--max-members", "0"],
            &["--max-members", "50001"],
            &["--format", "csv"],
        ] {
            assert!(slice(bad).is_err(), "{bad:?}");
        }
        // Names the API server would refuse (the slice names are the
        // policy's with a suffix).
        for bad in ["a..b", "a.-b", "a-.b", "A", "a-"] {
            let e = Cli::try_parse_from(["ipsetmgr", "slice", "--policy", bad, "-f", "-"])
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.to_string().contains("DNS subdomain"), "{bad}: {e}");
        }
        let long = "a".repeat(64);
        let e = Cli::try_parse_from(["ipsetmgr", "slice", "--policy", &long, "-f", "-"])
            .err()
            .unwrap();
        assert!(e.to_string().contains("at most 63"), "{e}");
    }
}
