//! Repeated names in a safetensors header. JSON allows an object key twice;
//! `safetensors` (through serde's maps) keeps the last value, so a repeated
//! metadata key silently changes the semantics and a repeated tensor name
//! surfaces as "invalid offset". This scan reads the header once more with
//! a visitor that sees every key, before the file is decoded.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

/// The first repeated name of the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repeated {
    /// A tensor name given twice.
    Tensor(String),
    /// A `__metadata__` key given twice.
    MetaKey(String),
}

/// Finds the first repeated tensor name or metadata key of the header of
/// `bytes` (a whole safetensors file). `None` when there is none, or when
/// the header is not readable JSON (the safetensors parser reports that).
pub fn first_repeated(bytes: &[u8]) -> Option<Repeated> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let end = 8usize.checked_add(usize::try_from(n).ok()?)?;
    let header = bytes.get(8..end)?;
    let mut de = serde_json::Deserializer::from_slice(header);
    de.deserialize_map(TopVisitor).ok().flatten()
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Option<Repeated>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a safetensors header object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = HashSet::new();
        let mut found = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                let dup = map.next_value::<MetaKeys>()?.0;
                if found.is_none() {
                    found = dup.map(Repeated::MetaKey);
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
            if !seen.insert(key.clone()) && found.is_none() {
                found = Some(if key == "__metadata__" {
                    Repeated::MetaKey(key)
                } else {
                    Repeated::Tensor(key)
                });
            }
        }
        Ok(found)
    }
}

/// The first repeated key of the `__metadata__` object.
struct MetaKeys(Option<String>);

impl<'de> serde::Deserialize<'de> for MetaKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MetaKeys;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the __metadata__ object")
            }
            fn visit_unit<E>(self) -> Result<MetaKeys, E> {
                Ok(MetaKeys(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetaKeys, A::Error> {
                let mut seen = HashSet::new();
                let mut found = None;
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if !seen.insert(key.clone()) && found.is_none() {
                        found = Some(key);
                    }
                }
                Ok(MetaKeys(found))
            }
        }
        d.deserialize_any(V)
    }
}

/// Names the tensor behind safetensors' nameless "invalid shape, data type,
/// or offset for tensor" (and its size overflow): the first tensor, in
/// data order, whose `prod(shape) * size(dtype)` does not match (or does
/// not fit) the bytes its `data_offsets` hold. `None` when the header of
/// `bytes` (a whole safetensors file) is not such JSON or no tensor is at
/// fault.
pub fn describe_bad_size(bytes: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let end = 8usize.checked_add(usize::try_from(n).ok()?)?;
    let header: serde_json::Value = serde_json::from_slice(bytes.get(8..end)?).ok()?;
    let mut tensors: Vec<(u64, u64, &str, &serde_json::Value)> = header
        .as_object()?
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(name, info)| {
            let o = info.get("data_offsets")?;
            Some((
                o.get(0)?.as_u64()?,
                o.get(1)?.as_u64()?,
                name.as_str(),
                info,
            ))
        })
        .collect();
    tensors.sort_by_key(|t| (t.0, t.1));
    tensors.into_iter().find_map(|(s, e, name, info)| {
        let dtype: safetensors::Dtype = serde_json::from_value(info.get("dtype")?.clone()).ok()?;
        let shape: Vec<u64> = serde_json::from_value(info.get("shape")?.clone()).ok()?;
        let held = e.checked_sub(s)?;
        let bits = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.bitsize() as u64));
        match bits {
            None => Some(format!(
                "tensor `{name}`: shape {shape:?} of {dtype:?} overflows (its data_offsets [{s}, {e}] hold {held} bytes)"
            )),
            Some(b) if b % 8 != 0 || b / 8 != held => Some(format!(
                "tensor `{name}`: shape {shape:?} of {dtype:?} needs {} bytes, its data_offsets [{s}, {e}] hold {held}",
                b.div_ceil(8)
            )),
            Some(_) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend(header.as_bytes());
        b
    }

    #[test]
    fn repeated_keys_are_found() {
        let h = r#"{"__metadata__":{"temperature":"1","temperature":"2"},"a":{}}"#;
        assert_eq!(
            first_repeated(&file(h)),
            Some(Repeated::MetaKey("temperature".into()))
        );
        let h = r#"{"a":{"dtype":"F32"},"a":{"dtype":"F32"}}"#;
        assert_eq!(first_repeated(&file(h)), Some(Repeated::Tensor("a".into())));
        let h = r#"{"__metadata__":{"x":"1"},"a":{},"b":{}}"#;
        assert_eq!(first_repeated(&file(h)), None);
        assert_eq!(first_repeated(b"\x05\0\0\0\0\0\0\0{"), None);
    }
}
