//! The client's own Chat Completions body, forwarded byte for byte but for the `model`
//! value: the value's span is found by a borrowing parse (every other field is skipped, not
//! built) and the new name spliced in its place.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct ModelField<'a> {
    #[serde(borrow)]
    model: Option<&'a RawValue>,
}

/// `raw` with its top-level `model` value replaced by `model` (as a JSON string). A body
/// without `model` gets none added.
pub fn with_model(raw: &Bytes, model: &str) -> Result<Bytes, serde_json::Error> {
    // A struct also deserializes from an array; only an object is a request.
    if raw.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(serde::de::Error::custom("the body must be a JSON object"));
    }
    let field: ModelField<'_> = serde_json::from_slice(raw)?;
    let Some(value) = field.model else {
        return Ok(raw.clone());
    };
    // The raw value borrows from `raw`: its offset is the distance between the two.
    let start = value.get().as_ptr() as usize - raw.as_ptr() as usize;
    let end = start + value.get().len();
    let mut out = Vec::with_capacity(raw.len() + model.len() + 2);
    out.extend_from_slice(&raw[..start]);
    serde_json::to_writer(&mut out, model)?;
    out.extend_from_slice(&raw[end..]);
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_model_value_changes() {
        let raw = Bytes::from_static(
            b"{ \"messages\" : [{\"role\":\"user\",\"content\":\"model\"}],\n  \"model\":\"pub\" , \"temperature\": 1.0e0, \"x\": {\"model\": 1} }",
        );
        let out = with_model(&raw, "real \"m\"").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "{ \"messages\" : [{\"role\":\"user\",\"content\":\"model\"}],\n  \"model\":\"real \\\"m\\\"\" , \"temperature\": 1.0e0, \"x\": {\"model\": 1} }"
        );
    }

    #[test]
    fn escaped_and_missing_and_invalid() {
        let raw = Bytes::from_static(b"{\"mod\\u0065l\":\"a\",\"n\":1}");
        assert_eq!(
            &with_model(&raw, "b").unwrap()[..],
            b"{\"mod\\u0065l\":\"b\",\"n\":1}"
        );
        let raw = Bytes::from_static(b"{\"n\":1}");
        assert_eq!(&with_model(&raw, "b").unwrap()[..], b"{\"n\":1}");
        assert!(with_model(&Bytes::from_static(b"{\"model\":\"a\""), "b").is_err());
        assert!(with_model(&Bytes::from_static(b"[1]"), "b").is_err());
    }
}
