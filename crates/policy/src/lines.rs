//! Lines of a text, found by a byte loop: member texts and lifted blocks
//! hold a million short lines, and `str::find` or `str::lines` set up a
//! searcher for each of them.

/// The line starting at byte `at`, without its line break, and the offset
/// of the next line.
pub(crate) fn line_at(text: &str, at: usize) -> (&str, usize) {
    let rest = &text[at..];
    match rest.bytes().position(|b| b == b'\n') {
        Some(i) => (&rest[..i], at + i + 1),
        None => (rest, text.len()),
    }
}

/// `text.lines()`, one line after another: the same lines (a line break is
/// `\n` or `\r\n`, a last one is optional; a `\r` without `\n` after it
/// stays).
pub(crate) fn each_line<'a>(text: &'a str, mut f: impl FnMut(&'a str)) {
    let mut at = 0;
    while at < text.len() {
        let (line, next) = line_at(text, at);
        let broke = text.as_bytes()[next - 1] == b'\n';
        f(match line.strip_suffix('\r') {
            Some(l) if broke => l,
            _ => line,
        });
        at = next;
    }
}
