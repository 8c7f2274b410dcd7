//! Text for people: producer-controlled text made inert before it reaches
//! a terminal or a log ([`escape`]), and the wording shared by messages
//! ([`wording`]: long lists named in part, times as people read them).

pub(crate) mod escape;
pub(crate) mod wording;
