//! Lower-case hex, the one spelling of keys, tags and digests in files, JSON and messages.

/// `bytes` as lower-case hex digits.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex digits (either case) as bytes; `None` for an odd length or a character that is not a
/// hex digit.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Exactly `2 N` hex digits as `N` bytes (a SHA-256 digest: `N = 32`).
pub fn decode_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    decode(text)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_bad_text_is_none() {
        assert_eq!(encode(&[0, 0xab, 0x7f]), "00ab7f");
        assert_eq!(decode("00AB7f"), Some(vec![0, 0xab, 0x7f]));
        assert_eq!(decode_array::<2>("abcd"), Some([0xab, 0xcd]));
        for bad in ["abc", "zz", "ab cd", "é1"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
        assert_eq!(decode_array::<3>("abcd"), None);
    }
}
