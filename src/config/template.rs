//! Page templates (`html.template`, docs/contract.md §16.2): read once while the config
//! is loaded, so a missing file or one without `{{content}}` is a config
//! error, and every page of a run uses the same text.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::error::{ConfigError, Place};
use super::model::HtmlTemplate;

/// Largest template accepted: a page skeleton, not a document.
const MAX_TEMPLATE_BYTES: u64 = 1024 * 1024;

/// Reads and checks the template at `path` (already resolved), named by the
/// config file `config_file`.
pub(super) fn read_template(path: &Path, config_file: &Path) -> Result<HtmlTemplate, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        at: Place {
            file: config_file.to_path_buf(),
            line_column: None,
        },
        message,
    };
    let shown = path.display();
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_TEMPLATE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| {
            invalid(format!(
                "html.template {shown}: cannot read it: {e}; create the file, fix the path (relative paths start at the config file's folder) or remove the key to use the built-in page"
            ))
        })?;
    if bytes.len() as u64 > MAX_TEMPLATE_BYTES {
        return Err(invalid(format!(
            "html.template {shown}: larger than {MAX_TEMPLATE_BYTES} bytes; a template is a page skeleton with {{{{title}}}} and {{{{content}}}}"
        )));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        invalid(format!(
            "html.template {shown}: not valid UTF-8 (byte {}); save it as UTF-8",
            e.utf8_error().valid_up_to()
        ))
    })?;
    if !text.contains("{{content}}") {
        return Err(invalid(format!(
            "html.template {shown}: has no {{{{content}}}} placeholder, so pages would have no content; add {{{{content}}}} where the rendered markdown goes (and {{{{title}}}} for the page title)"
        )));
    }
    Ok(HtmlTemplate {
        path: path.to_path_buf(),
        text: Arc::from(text),
    })
}
