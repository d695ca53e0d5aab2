//! The names the client's tools are declared under in the session's MCP server. Claude Code
//! shows an MCP tool to the model as `mcp__<server>__<name>`, and Anthropic takes a tool name
//! of at most 64 characters from `[A-Za-z0-9_-]`. A client tool keeps its name unless it
//! would not fit that, or it is named like one of the built-ins the session enables (which
//! the model would confuse with it): then it is declared under a name that fits (`client_`
//! before a built-in's name; a too long or foreign name cut and given a short digest), and
//! its calls come back under the client's name.

/// The SDK MCP server that serves the client's tools.
pub const SERVER: &str = "t";
/// How Claude Code prefixes the server's tools.
pub const PREFIX: &str = "mcp__t__";
/// Anthropic's bound on a tool name.
const MAX_TOOL_NAME: usize = 64;

/// Client tool names and the names they are declared under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// (declared, client's), in the client's order.
    pairs: Vec<(String, String)>,
}

impl Names {
    /// Declares `tools` (the client's names) beside the enabled `builtins`.
    pub fn new<'a>(tools: impl IntoIterator<Item = &'a str>, builtins: &[String]) -> Names {
        let tools: Vec<&str> = tools.into_iter().collect();
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(tools.len());
        let room = MAX_TOOL_NAME - PREFIX.len();
        for name in &tools {
            let fits = name.len() <= room && valid(name);
            let shadows = builtins.iter().any(|b| b.eq_ignore_ascii_case(name));
            let taken = |d: &str, pairs: &[(String, String)]| {
                pairs.iter().any(|(p, _)| p == d)
                    || (d != *name && tools.contains(&d))
                    || builtins.iter().any(|b| b.eq_ignore_ascii_case(d))
            };
            let base = match (fits, shadows) {
                (true, false) => name.to_string(),
                (true, true) if name.len() + "client_".len() <= room => format!("client_{name}"),
                (_, true) => shortened(&format!("client_{name}"), room),
                (false, false) => shortened(name, room),
            };
            let mut declared = base.clone();
            let mut n = 1;
            while taken(&declared, &pairs) {
                n += 1;
                let suffix = format!("_{n}");
                declared = format!("{}{suffix}", shortened(&base, room - suffix.len()));
            }
            pairs.push((declared, name.to_string()));
        }
        Names { pairs }
    }

    /// The name `client` is declared under.
    pub fn declared<'a>(&'a self, client: &'a str) -> &'a str {
        self.pairs
            .iter()
            .find(|(_, c)| c == client)
            .map_or(client, |(d, _)| d)
    }

    /// The client's name of a declared tool (as `tools/call` names it, unprefixed).
    pub fn client(&self, declared: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(d, _)| d == declared)
            .map(|(_, c)| c.as_str())
    }

    /// Whether a tool name as the model sees it (`mcp__t__…`) is one of the client's.
    pub fn is_client_tool(&self, model_name: &str) -> bool {
        model_name
            .strip_prefix(PREFIX)
            .is_some_and(|d| self.client(d).is_some())
    }

    /// Every tool as the model sees it, for `--allowedTools`.
    pub fn allowed(&self) -> impl Iterator<Item = String> + '_ {
        self.pairs.iter().map(|(d, _)| format!("{PREFIX}{d}"))
    }
}

fn valid(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `name` with foreign characters as `_`, cut to `max` with an 8-hex digest of the whole
/// name when it does not fit as it is.
fn shortened(name: &str, max: usize) -> String {
    let clean: String = name
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
            true => c,
            false => '_',
        })
        .collect();
    if clean.len() <= max && clean == name && !clean.is_empty() {
        return clean;
    }
    let digest = hex::encode(&crate::digest::sha256(name.as_bytes())[..4]);
    let keep = max.saturating_sub(digest.len() + 1);
    format!("{}_{digest}", &clean[..keep.min(clean.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_fit_are_kept_and_come_back() {
        let n = Names::new(["read_file", "get-weather"], &[]);
        assert_eq!(n.declared("read_file"), "read_file");
        assert_eq!(n.client("get-weather"), Some("get-weather"));
        assert!(n.is_client_tool("mcp__t__read_file"));
        assert!(!n.is_client_tool("read_file"));
        assert!(!n.is_client_tool("mcp__t__nope"));
        assert_eq!(
            n.allowed().collect::<Vec<_>>(),
            ["mcp__t__read_file", "mcp__t__get-weather"]
        );
    }

    #[test]
    fn a_name_like_an_enabled_builtin_is_declared_under_another() {
        let builtins = ["Bash".to_string(), "Edit".to_string()];
        let n = Names::new(["Bash", "client_Bash", "Read"], &builtins);
        assert_eq!(n.declared("Bash"), "client_Bash_2");
        assert_eq!(n.client("client_Bash_2"), Some("Bash"));
        assert_eq!(n.declared("client_Bash"), "client_Bash");
        assert_eq!(n.declared("Read"), "Read");
        // Not enabled: nothing to shadow.
        assert_eq!(Names::new(["Bash"], &[]).declared("Bash"), "Bash");
    }

    #[test]
    fn long_and_foreign_names_are_mapped_never_refused() {
        let long = "x".repeat(80);
        let n = Names::new([long.as_str(), "ns.tool", "a".repeat(56).as_str()], &[]);
        let d = n.declared(&long);
        assert!(PREFIX.len() + d.len() <= 64, "{d}");
        assert_eq!(n.client(d), Some(long.as_str()));
        let d = n.declared("ns.tool");
        assert!(d.starts_with("ns_tool_") && valid(d), "{d}");
        assert_eq!(n.client(d), Some("ns.tool"));
        // 56 characters fit exactly once prefixed.
        assert_eq!(n.declared(&"a".repeat(56)), "a".repeat(56));
        // Two long names that share their first characters stay distinct.
        let (a, b) = (
            format!("{}a", "y".repeat(70)),
            format!("{}b", "y".repeat(70)),
        );
        let n = Names::new([a.as_str(), b.as_str()], &[]);
        assert_ne!(n.declared(&a), n.declared(&b));
        assert_eq!(n.client(n.declared(&b)), Some(b.as_str()));
    }
}
