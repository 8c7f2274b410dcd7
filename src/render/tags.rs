//! Reading the tags of HTML: where a tag ends, its name and attributes,
//! and the first heading's text. Both the sanitizer (`sanitize`), which
//! counts the elements raw HTML leaves open, and the event rewriter
//! (`events`), which looks for a title in raw HTML, read tags this way.

/// The plain text of the first heading (`h1` to `h6`) of `html` (what
/// the sanitizer wrote), as a reader sees it: its text and image alt text,
/// without the section self-link, whitespace collapsed; empty when the
/// heading holds no text. `None` when there is no heading.
pub(super) fn first_heading(html: &str) -> Option<String> {
    let mut text = String::new();
    let mut in_heading: Option<String> = None;
    // Depth inside an `<a class="anchor">` (the self-link's `#`).
    let mut in_anchor = 0usize;
    let mut rest = html;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            if in_heading.is_some() && in_anchor == 0 {
                text.push_str(rest);
            }
            break;
        };
        if in_heading.is_some() && in_anchor == 0 {
            text.push_str(&rest[..lt]);
        }
        rest = &rest[lt..];
        let end = tag_end(rest);
        // Without its `<` and, when it has one, its `>` (raw HTML that
        // raw_html: allow passes may leave a tag unterminated).
        let inner_end = if rest[..end].ends_with('>') {
            end - 1
        } else {
            end
        };
        let tag = &rest[1..inner_end.max(1)];
        rest = &rest[end..];
        let (closing, name) = tag_name(tag);
        let heading = matches!(name.as_str(), "h1" | "h2" | "h3" | "h4" | "h5" | "h6");
        match (&in_heading, closing) {
            (None, false) if heading => in_heading = Some(name),
            (Some(open), true) if *open == name => return Some(collapse(&decode(&text))),
            (Some(_), false) if name == "a" && tag.contains("class=\"anchor\"") => in_anchor += 1,
            (Some(_), true) if name == "a" && in_anchor > 0 => in_anchor -= 1,
            (Some(_), false) if name == "img" && in_anchor == 0 => {
                if let Some(alt) = attribute(tag, "alt") {
                    text.push(' ');
                    text.push_str(alt);
                    text.push(' ');
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `tag` (the text after `<`) closes an element, and the element's
/// name, lowercased.
pub(super) fn tag_name(tag: &str) -> (bool, String) {
    let name = tag
        .trim_start_matches('/')
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    (tag.starts_with('/'), name)
}

/// Where the tag starting at `html[0] == '<'` ends (after its `>`),
/// skipping quoted attribute values.
pub(super) fn tag_end(html: &str) -> usize {
    let mut quote = None;
    for (i, c) in html.char_indices().skip(1) {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '>') => return i + 1,
            _ => {}
        }
    }
    html.len()
}

/// The value of `name="..."` in a serialized tag.
fn attribute<'t>(tag: &'t str, name: &str) -> Option<&'t str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[at..].find('"')?;
    Some(&tag[at..at + len])
}

/// Text with the entities the serializer writes decoded.
fn decode(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_heading_is_its_text_without_the_self_link() {
        // (sanitized HTML, title)
        let cases = [
            (
                "<p>x</p><h2 id=\"a\">A <em>b</em><a class=\"anchor\" href=\"#a\">#</a></h2>",
                Some("A b"),
            ),
            (
                "<div align=\"center\"><img alt=\"Logo\" src=\"l.png\"><h1>Name &amp; Co</h1></div>",
                Some("Name & Co"),
            ),
            ("<h1><img alt=\"Logo\" src=\"l.png\"></h1>", Some("Logo")),
            // The first heading decides, even without text (the caller
            // then uses the file name).
            ("<h3></h3><h4>Second</h4>", Some("")),
            ("<h1>Serde&nbsp;\u{2003}Norway</h1>", Some("Serde Norway")),
            ("<p title=\"<h1>no</h1>\">text</p>", None),
            (
                "<h1 align=\"center\"><img src=\"l.svg\"></h1><h2>Features</h2>",
                Some(""),
            ),
            ("<p>no heading</p>", None),
        ];
        for (html, title) in cases {
            assert_eq!(first_heading(html).as_deref(), title, "{html}");
        }
    }
}
