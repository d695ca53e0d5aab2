//! The four digests of a suspension point, compared in constant time.

use subtle::ConstantTimeEq;

/// SHA-256 of the canonical tool set, tool choice, conversation prefix and assistant echo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digests {
    pub tools: [u8; 32],
    pub tool_choice: [u8; 32],
    pub prefix: [u8; 32],
    pub echo: [u8; 32],
}

impl Digests {
    /// Which digest differs, compared in constant time on fixed 32-byte arrays.
    pub fn first_mismatch(&self, other: &Digests) -> Option<&'static str> {
        let pairs = [
            ("tools", &self.tools, &other.tools),
            ("tool_choice", &self.tool_choice, &other.tool_choice),
            ("conversation prefix", &self.prefix, &other.prefix),
            ("assistant message", &self.echo, &other.echo),
        ];
        let mut first = None;
        for (name, a, b) in pairs {
            if !bool::from(a.ct_eq(b)) && first.is_none() {
                first = Some(name);
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_names_the_first_difference() {
        let a = Digests {
            tools: [1; 32],
            tool_choice: [2; 32],
            prefix: [3; 32],
            echo: [4; 32],
        };
        let mut b = a;
        assert_eq!(a.first_mismatch(&b), None);
        b.echo[0] ^= 1;
        assert_eq!(a.first_mismatch(&b), Some("assistant message"));
        b.tools[31] ^= 1;
        assert_eq!(a.first_mismatch(&b), Some("tools"));
    }
}
