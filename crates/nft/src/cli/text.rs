//! The one thing read from `nft`'s text output rather than its JSON: a
//! set's flags. nft 1.0.6's JSON leaves `flags dynamic` out (a set with it
//! lists exactly as one without), while its text listing prints every flag
//! on the set's `flags` line. Nothing is ever sent as text: this only reads
//! `nft -t list set FAMILY TABLE SET` (terse: no elements), strictly, and
//! anything not in the shape nft prints is an error, not a guess.
//!
//! What nft 1.0.6 prints (`-t`; each indent is one tab), the comment
//! exactly as the JSON has it:
//!
//! ```text
//! table inet ipsetmgr {
//!     set ipm4-blocklist {
//!         type ipv4_addr
//!         size 65536
//!         flags dynamic,timeout
//!         comment "..."
//!     }
//! }
//! ```

use crate::Table;

/// The flag words of `set`'s `flags` line (empty without one). `comment`:
/// the set's comment as the JSON listing gave it; nft prints it unescaped,
/// so its text is taken out first and cannot pass for a `flags` line.
pub fn set_flags(
    text: &str,
    table: &Table,
    set: &str,
    comment: Option<&str>,
) -> Result<Vec<String>, String> {
    let head = format!("table {} {} {{\n", table.family.nft_name(), table.name);
    let rest = text
        .strip_prefix(head.as_str())
        .ok_or_else(|| format!("it does not start with `{}`", head.trim_end()))?;
    let open = format!("\tset {set} {{\n");
    let at = rest
        .find(open.as_str())
        .ok_or_else(|| format!("no `{}` line", open.trim()))?;
    let body = rest[at + open.len()..]
        .strip_suffix("\t}\n}\n")
        .ok_or("the set's block does not end the listing")?;
    let commented;
    let body = match comment {
        Some(c) => {
            let line = format!("\t\tcomment \"{c}\"\n");
            commented = body.replacen(line.as_str(), "", 1);
            commented.as_str()
        }
        None => body,
    };
    let mut flags: Option<Vec<String>> = None;
    for line in body.lines() {
        let Some(field) = line.strip_prefix("\t\t") else {
            return Err(format!("a line that is not one of the set's: {line:?}"));
        };
        let Some(words) = field.strip_prefix("flags ") else {
            continue; // type, size, timeout, policy, counter, ...: JSON has them
        };
        if flags.is_some() {
            return Err("two `flags` lines".into());
        }
        let words: Vec<String> = words.split(',').map(str::to_string).collect();
        if let Some(bad) = words
            .iter()
            .find(|w| w.is_empty() || !w.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'))
        {
            return Err(format!("a flag that is no word: {bad:?}"));
        }
        flags = Some(words);
    }
    Ok(flags.unwrap_or_default())
}
