//! Terminal width, for summaries that fit the operator's window.

/// Width used when output is not a terminal and `COLUMNS` is unset.
pub const DEFAULT_WIDTH: usize = 100;
/// Never format narrower than this: below it every line would be an ellipsis.
const MIN_WIDTH: usize = 40;

/// `COLUMNS` if set, else the width of the terminal on stdout, else [`DEFAULT_WIDTH`].
pub fn width() -> usize {
    let from_env = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok());
    from_env
        .or_else(stdout_columns)
        .unwrap_or(DEFAULT_WIDTH)
        .max(MIN_WIDTH)
}

fn stdout_columns() -> Option<usize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the valid, exclusively borrowed `ws`; on a
    // non-terminal it fails with ENOTTY and writes nothing.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// `prefix` followed by `text`, word-wrapped to `width` columns; continuation lines are
/// indented by `indent` spaces. Words longer than a line are kept whole rather than cut, so
/// paths and digests stay copyable. Returns the lines joined with `\n`, newline-terminated.
pub fn wrap(prefix: &str, text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut line = prefix.to_owned();
    let mut line_len = line.chars().count();
    let mut fresh = true; // nothing but the prefix/indent on this line yet
    for word in text.split_whitespace() {
        let wlen = word.chars().count();
        if !fresh && line_len + 1 + wlen > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
            line_len = indent;
            fresh = true;
        }
        if !fresh {
            line.push(' ');
            line_len += 1;
        }
        line.push_str(word);
        line_len += wlen;
        fresh = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_indents_continuations_and_keeps_long_words() {
        assert_eq!(wrap("OK  ", "short", 40, 4), "OK  short\n");
        assert_eq!(
            wrap("WARN ", "one two three four", 15, 5),
            "WARN one two\n     three four\n"
        );
        let long = "/a/very/long/path/that/does/not/fit";
        assert_eq!(wrap("x ", long, 10, 2), format!("x {long}\n"));
        assert_eq!(
            wrap("x ", &format!("a {long}"), 10, 2),
            format!("x a\n  {long}\n")
        );
    }
}
