//! Deserializers the resource types share: a leaf module, so the policy
//! and member-source types need not import each other for them.

/// An optional u32 written as a number. A quoted `"100"` is refused: YAML
/// would read it as a string everywhere else, and the schema says integer.
/// Numbers out of range are refused with the value and the bound.
pub fn integer<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    struct Visitor;
    impl serde::de::Visitor<'_> for Visitor {
        type Value = Option<u32>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an integer from 0 to 4294967295 (not a string)")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            u32::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Visitor)
}
