//! What an nft named set is to this crate: its key (one field or a
//! concatenation of fields), whether it holds intervals, and its size. These
//! are the properties the kernel stores and reports back, so they are what a
//! resync compares (see docs/architecture.md for the manager's resync).

use std::fmt;

/// One field of a set key, named as `nft` names the data type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FieldType {
    Ipv4Addr,
    Ipv6Addr,
    EtherAddr,
    InetProto,
    InetService,
    Mark,
    Ifname,
}

impl FieldType {
    pub const ALL: [FieldType; 7] = [
        FieldType::Ipv4Addr,
        FieldType::Ipv6Addr,
        FieldType::EtherAddr,
        FieldType::InetProto,
        FieldType::InetService,
        FieldType::Mark,
        FieldType::Ifname,
    ];

    /// The name `nft` gives the type (`type ipv4_addr`).
    pub fn nft_name(self) -> &'static str {
        match self {
            FieldType::Ipv4Addr => "ipv4_addr",
            FieldType::Ipv6Addr => "ipv6_addr",
            FieldType::EtherAddr => "ether_addr",
            FieldType::InetProto => "inet_proto",
            FieldType::InetService => "inet_service",
            FieldType::Mark => "mark",
            FieldType::Ifname => "ifname",
        }
    }

    pub fn from_nft_name(s: &str) -> Option<FieldType> {
        FieldType::ALL.into_iter().find(|f| f.nft_name() == s)
    }

    /// nft's datatype number (`enum datatypes` in nftables' datatype.h):
    /// the kernel stores it opaquely in NFTA_SET_KEY_TYPE, and `nft list`
    /// reads it back to know how to print the elements.
    pub(crate) fn type_id(self) -> u32 {
        match self {
            FieldType::Ipv4Addr => 7,
            FieldType::Ipv6Addr => 8,
            FieldType::EtherAddr => 9,
            FieldType::InetProto => 12,
            FieldType::InetService => 13,
            FieldType::Mark => 19,
            FieldType::Ifname => 41,
        }
    }

    pub(crate) fn from_type_id(id: u32) -> Option<FieldType> {
        FieldType::ALL.into_iter().find(|f| f.type_id() == id)
    }

    /// Bytes of the value itself.
    pub fn len(self) -> usize {
        match self {
            FieldType::Ipv4Addr | FieldType::Mark => 4,
            FieldType::Ipv6Addr | FieldType::Ifname => 16,
            FieldType::EtherAddr => 6,
            FieldType::InetProto => 1,
            FieldType::InetService => 2,
        }
    }

    /// Never true: every field has a value.
    pub fn is_empty(self) -> bool {
        false
    }

    /// Bytes the field takes in a key: the kernel keeps each field of a
    /// concatenation in whole 32-bit registers, so every field is padded
    /// to a multiple of 4.
    pub fn reg_len(self) -> usize {
        self.len().div_ceil(4) * 4
    }

    /// A mark is a host-order integer; every other field is in network
    /// order (so comparing bytes compares values).
    pub(crate) fn host_order(self) -> bool {
        self == FieldType::Mark
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.nft_name())
    }
}

/// The most fields a key of this crate has (hash:ip,port,ip: four). The
/// kernel's limit is 16 registers of 4 bytes (64 bytes of key).
pub const MAX_FIELDS: usize = 4;

/// nft packs the datatypes of a concatenation into one number, 6 bits per
/// field, the first field highest (nftables' TYPE_BITS).
const TYPE_BITS: u32 = 6;

/// A set's key: one field or a concatenation (`ipv4_addr . inet_service`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyType {
    fields: [FieldType; MAX_FIELDS],
    n: u8,
}

impl KeyType {
    pub fn single(f: FieldType) -> KeyType {
        KeyType {
            fields: [f; MAX_FIELDS],
            n: 1,
        }
    }

    /// A key of 1 to [`MAX_FIELDS`] fields.
    pub fn concat(fields: &[FieldType]) -> Option<KeyType> {
        if fields.is_empty() || fields.len() > MAX_FIELDS {
            return None;
        }
        let mut k = KeyType::single(fields[0]);
        k.fields[..fields.len()].copy_from_slice(fields);
        k.n = fields.len() as u8;
        Some(k)
    }

    pub fn fields(&self) -> &[FieldType] {
        &self.fields[..self.n as usize]
    }

    pub fn is_concat(&self) -> bool {
        self.n > 1
    }

    /// The key's length in bytes as the kernel holds it (NFTA_SET_KEY_LEN):
    /// a single field is its value (an `ether_addr` key is 6 bytes, as `nft`
    /// declares it, and `nft list` asserts on any other length); the fields
    /// of a concatenation are padded to whole registers.
    pub fn len(&self) -> usize {
        match self.fields() {
            [one] => one.len(),
            many => many.iter().map(|f| f.reg_len()).sum(),
        }
    }

    /// Cut a key built of padded fields to [`KeyType::len`].
    pub(crate) fn fit(&self, key: &mut Vec<u8>) {
        if !self.is_concat() {
            key.truncate(self.len());
        }
    }

    /// Never true: a key has at least one field.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Byte offset of field `i` in the key.
    pub(crate) fn offset(&self, i: usize) -> usize {
        self.fields()[..i].iter().map(|f| f.reg_len()).sum()
    }

    pub(crate) fn type_id(&self) -> u32 {
        self.fields()
            .iter()
            .fold(0, |acc, f| (acc << TYPE_BITS) | f.type_id())
    }

    /// The key nft declared with datatype number `id` and length `key_len`;
    /// `None` for types this crate does not know (or lengths that do not
    /// match them).
    pub(crate) fn from_type_id(id: u32, key_len: u32) -> Option<KeyType> {
        let mut rev = Vec::with_capacity(MAX_FIELDS);
        let mut rest = id;
        while rest != 0 {
            if rev.len() == MAX_FIELDS {
                return None;
            }
            rev.push(FieldType::from_type_id(rest & ((1 << TYPE_BITS) - 1))?);
            rest >>= TYPE_BITS;
        }
        rev.reverse();
        let k = KeyType::concat(&rev)?;
        (k.len() as u32 == key_len).then_some(k)
    }
}

/// `ipv4_addr . inet_proto . inet_service`, as `nft list` declares it.
impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, field) in self.fields().iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            f.write_str(field.nft_name())?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyType({self})")
    }
}

/// An nft set as this crate creates it and reads it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NftSetSpec {
    pub key: KeyType,
    /// `flags interval`: elements are ranges (for a concatenation, each
    /// field of an element is a range; the exact ones are one value wide).
    pub interval: bool,
    /// `size`: the most elements the kernel accepts (an interval is one
    /// element). `None`: unbounded (never created by this crate).
    pub size: Option<u32>,
}

impl fmt::Display for NftSetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "type {}", self.key)?;
        if self.interval {
            f.write_str("; flags interval")?;
        }
        if let Some(size) = self.size {
            write!(f, "; size {size}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_type_numbers_are_nfts() {
        use FieldType::*;
        // Numbers `nft --debug=mnl add set` sends for these declarations.
        let k = KeyType::concat(&[Ipv4Addr, InetProto, InetService]).unwrap();
        assert_eq!(k.type_id(), 0x730d);
        assert_eq!(k.len(), 12);
        assert_eq!(KeyType::concat(&[Ipv4Addr, Mark]).unwrap().type_id(), 0x1d3);
        assert_eq!(KeyType::from_type_id(0x730d, 12), Some(k));
        assert_eq!(KeyType::from_type_id(0x730d, 11), None, "length must fit");
        assert_eq!(KeyType::from_type_id(7, 4), Some(KeyType::single(Ipv4Addr)));
        assert_eq!(KeyType::from_type_id(0, 0), None);
        assert_eq!(KeyType::from_type_id(5, 4), None, "string: not ours");
        assert_eq!(KeyType::from_type_id(u32::MAX, 64), None);
        assert_eq!(k.to_string(), "ipv4_addr . inet_proto . inet_service");
        assert_eq!(k.offset(2), 8);
        assert_eq!(KeyType::single(EtherAddr).len(), 6);
        assert_eq!(KeyType::single(InetService).len(), 2);
        assert_eq!(KeyType::concat(&[Ipv4Addr, EtherAddr]).unwrap().len(), 12);
        assert_eq!(KeyType::concat(&[]), None);
        assert_eq!(KeyType::concat(&[Mark; 5]), None);
    }
}
