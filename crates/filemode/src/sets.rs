//! `ipsetmgr sets`: the owned sets in this kernel, with counts.

use std::io::Write;

use crate::table;
use ipsetmgr_ipset::Naming;
use ipsetmgr_sets::{KernelError, SetsBackend};

pub fn sets(
    mut backend: Box<dyn SetsBackend>,
    naming: &Naming,
    out: &mut dyn Write,
) -> Result<(), SetsError> {
    let rows: Vec<Vec<String>> = backend
        .list()?
        .into_iter()
        .map(|s| {
            vec![
                s.set.name,
                s.kind,
                s.members.to_string(),
                s.max_elem.map_or("-".into(), |m| m.to_string()),
                s.references.to_string(),
                s.role.into(),
            ]
        })
        .collect();
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
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
