//! Entry comments (the kernel's `comment` extension).

use std::fmt;

use crate::error::MemberError;

/// The longest comment the kernel stores (IPSET_MAX_COMMENT_SIZE).
pub const MAX_COMMENT_LEN: usize = 255;

/// A comment the kernel and `ipset(8)` both hold as written: 1 to 255
/// printable ASCII characters, without `"` (ipset refuses it) or `\` (it
/// would read as an escape), and without leading or trailing spaces (an
/// empty comment is dropped by ipset, spaces at the ends are easily lost).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Comment(Box<str>);

impl Comment {
    pub fn parse(s: &str) -> Result<Comment, MemberError> {
        if s.is_empty() || s.len() > MAX_COMMENT_LEN {
            return Err(MemberError::BadComment("a comment has 1 to 255 characters"));
        }
        if !s
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
        {
            return Err(MemberError::BadComment(
                "a comment has printable ASCII characters only, without \" or \\",
            ));
        }
        if s.starts_with(' ') || s.ends_with(' ') {
            return Err(MemberError::BadComment(
                "a comment does not start or end with a space",
            ));
        }
        Ok(Comment(s.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Comment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments() {
        for ok in [
            "office",
            "source: spamhaus 2026-11-30",
            "a,b:c",
            &"x".repeat(255),
        ] {
            assert_eq!(Comment::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            " lead",
            "trail ",
            "say \"hi\"",
            "back\\slash",
            "tab\there",
            "ü",
            &"x".repeat(256),
        ] {
            assert!(Comment::parse(bad).is_err(), "{bad:?}");
        }
    }
}
