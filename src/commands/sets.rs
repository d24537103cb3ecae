//! `ipsetmgr sets`: the owned sets in this kernel, with counts.

use std::io::Write;

use super::table;
use crate::dataplane::{Dataplane, DataplaneError};
use crate::ipset::Naming;

pub fn sets(
    mut dp: Box<dyn Dataplane>,
    naming: &Naming,
    out: &mut dyn Write,
) -> Result<(), SetsError> {
    let names = dp.list_owned(&|n| naming.owns(n))?;
    let mut rows = Vec::new();
    for name in names {
        let Some(k) = dp.read_set(&name)? else {
            continue;
        };
        let (kind, max) = match &k.header {
            Some(h) => (h.kind.to_string(), h.max_elem.to_string()),
            None => ("(unmanaged type)".into(), "-".into()),
        };
        let role = if naming.is_temp(&name) {
            "temp"
        } else {
            "main"
        };
        rows.push(vec![
            name,
            kind,
            k.members.as_ref().map_or(0, |m| m.len()).to_string(),
            max,
            k.references.to_string(),
            role.into(),
        ]);
    }
    if rows.is_empty() {
        writeln!(
            out,
            "No sets with prefix {:?} in this kernel.",
            naming.prefix()
        )?;
    } else {
        write!(
            out,
            "{}",
            table::render(
                &["NAME", "TYPE", "MEMBERS", "MAXELEM", "REFERENCES", "ROLE"],
                &rows
            )
        )?;
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum SetsError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
