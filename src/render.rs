//! Markdown to HTML (being written).
