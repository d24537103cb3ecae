//! Plain-text tables for command output.

/// Render rows under headers with columns padded to their widest cell.
pub(crate) fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            out.push_str(cell);
            if i != last {
                // Padded by hand: format's `{:<w$}` panics for widths
                // above 65535, and a cell may be that long.
                let pad = w.saturating_sub(cell.chars().count()) + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let t = super::render(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
    }

    #[test]
    fn cells_of_any_width_render() {
        let wide = "n".repeat(70_000);
        let t = super::render(&["A", "B"], &[vec![wide.clone(), "x".into()]]);
        assert!(t.starts_with(&format!("A{}B\n", " ".repeat(70_001))));
        assert!(t.ends_with(&format!("{wide}  x\n")));
    }
}
