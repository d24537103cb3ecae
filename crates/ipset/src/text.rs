//! Text helpers for messages: a leaf module (it imports nothing of this
//! crate), used by every layer's errors (the policy compiler's and loaders',
//! the nft backend's) and by the binary's logging.

/// The most bytes of one member an error quotes (docs/member-sources.md):
/// a member can carry a comment of up to 255 bytes, and a long list of
/// errors quoting each whole would crowd out the reasons.
pub const MAX_QUOTED_MEMBER: usize = 100;

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
