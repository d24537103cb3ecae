//! Text helpers for messages: a leaf module (it imports nothing of this
//! crate), used by the compiler's and loaders' errors and by the binary's
//! logging.

/// A message of at most `max` bytes, the note of the cut included (cut on
/// a character boundary), for errors that may quote input and for fields
/// whose schema bounds their length: an API server refuses a whole object
/// for one string over its maxLength.
pub fn bounded(message: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if message.len() <= max {
        return message.into();
    }
    // "... (N bytes cut)": N has at most as many digits as the length.
    let note = "... ( bytes cut)".len() + message.len().to_string().len();
    let mut cut = max.saturating_sub(note);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes cut)", &message[..cut], message.len() - cut).into()
}
