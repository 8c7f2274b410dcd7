//! Recording: a command run under `strace -f -y -xx -X raw`, and the
//! parser of what it prints. Every string (names, written bytes, the
//! `-y` paths of descriptors) comes hex-escaped and every flag as a
//! number, so a line splits without knowing any quoting rule but `\xHH`.

use std::path::Path;
use std::process::Command;

/// The calls recorded: what creates, changes, moves or removes a file or
/// folder, or makes that durable, and `lseek` and the `dup`s that move or
/// copy a descriptor's offset. `copy_file_range`, `sendfile` and `splice`
/// are recorded only to refuse them on a traced file (their bytes are not
/// printed).
pub const TRACED: &str = "open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,\
unlink,unlinkat,rmdir,link,linkat,symlink,symlinkat,write,pwrite64,writev,pwritev,pwritev2,\
ftruncate,truncate,fallocate,fsync,fdatasync,syncfs,sync,chmod,fchmod,fchmodat,lseek,\
dup,dup2,dup3,fcntl,copy_file_range,sendfile,splice,mknod,mknodat";

/// The longest buffer printed whole (a longer write fails the recording).
const STRSIZE: usize = 1 << 24;

/// One argument or return value as strace prints it.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    /// A string; `cut` when strace shortened it (`"..."...`).
    Str {
        bytes: Vec<u8>,
        cut: bool,
    },
    /// A descriptor with its `-y` path (`3</x/y>`).
    Fd {
        fd: i64,
        path: Vec<u8>,
    },
    List(Vec<Val>),
    Struct(Vec<(String, Val)>),
    Other(String),
}

impl Val {
    pub fn int(&self) -> Option<i64> {
        match self {
            Val::Int(n) => Some(*n),
            Val::Fd { fd, .. } => Some(*fd),
            _ => None,
        }
    }

    pub fn field(&self, name: &str) -> Option<&Val> {
        match self {
            Val::Struct(fields) => fields.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// One completed call.
#[derive(Debug, Clone)]
pub struct Call {
    pub name: String,
    pub args: Vec<Val>,
    /// The return value: `Err` with the error name for `-1 ENOENT (...)`.
    pub ret: Result<Val, String>,
    /// The line (for messages).
    pub line: String,
}

/// Runs `cmd` under strace, the record going to `out`; returns its exit
/// code. Fails the test when strace is missing.
pub fn record(cmd: &mut Command, out: &Path) -> i32 {
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut traced = Command::new("strace");
    traced
        .args(["-f", "-qq", "-y", "-xx", "-X", "raw", "--seccomp-bpf"])
        .args(["-e", "signal=none", "-e"])
        .arg(format!("trace={TRACED}"))
        .args(["-s", &STRSIZE.to_string(), "-o"])
        .arg(out)
        .arg("--")
        .arg(program)
        .args(args);
    if let Some(dir) = cmd.get_current_dir() {
        traced.current_dir(dir);
    }
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => traced.env(k, v),
            None => traced.env_remove(k),
        };
    }
    traced
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let status = traced.status().unwrap_or_else(|e| {
        panic!("cannot run strace ({e}): install it (apt-get install strace, scripts/install-test-deps)")
    });
    status.code().unwrap_or(-1)
}

/// Parses a whole record, joining the halves of calls that another
/// thread interrupted (`<unfinished ...>` / `<... resumed>`): each call
/// takes its place where it completed.
pub fn parse(text: &str) -> Result<Vec<Call>, String> {
    let mut pending: std::collections::HashMap<u32, String> = Default::default();
    let mut calls = Vec::new();
    for line in text.lines() {
        let Some((tid, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(tid) = tid.parse::<u32>() else {
            return Err(format!("no thread id: {line}"));
        };
        let rest = rest.trim_start();
        if rest.starts_with("+++") || rest.starts_with("---") || rest.starts_with("???(") {
            continue;
        }
        if rest.ends_with("<detached ...>") {
            // strace let go of the thread inside the call (seen on a
            // spawned child's dup3 of its standard input, once in a few
            // hundred runs): it never completed while traced. A change it made anyway shows as a model that does
            // not end where the command did.
            pending.remove(&tid);
            continue;
        }
        let full = if let Some(head) = rest.strip_suffix("<unfinished ...>") {
            pending.insert(tid, head.to_owned());
            continue;
        } else if let Some(tail) = rest.strip_prefix("<... ") {
            let Some((_, tail)) = tail.split_once(" resumed>") else {
                return Err(format!("bad resumption: {line}"));
            };
            let Some(head) = pending.remove(&tid) else {
                return Err(format!("resumed call never started: {line}"));
            };
            if tail.contains("<unfinished ...>") {
                // Its process exited in the call: it never completed.
                continue;
            }
            format!("{head}{tail}")
        } else if rest.contains("<unfinished ...>") {
            // `call(... <unfinished ...>) = ?`: its process exited in it.
            continue;
        } else {
            rest.to_owned()
        };
        if let Some(call) = parse_call(&full)? {
            calls.push(call);
        }
    }
    Ok(calls)
}

/// One call's line (without the thread id). `None` for a call that never
/// returned (`= ?`: its process was killed in it).
pub fn parse_call(line: &str) -> Result<Option<Call>, String> {
    let bad = |why: &str| format!("{why}: {line}");
    let open = line.find('(').ok_or_else(|| bad("no ("))?;
    let name = line[..open].to_owned();
    let mut p = Parser {
        s: line.as_bytes(),
        i: open + 1,
    };
    let mut args = Vec::new();
    p.ws();
    if p.peek() != Some(b')') {
        loop {
            args.push(p.val().map_err(|e| bad(&e))?);
            p.ws();
            match p.next() {
                Some(b',') => continue,
                Some(b')') => break,
                _ => return Err(bad("expected , or )")),
            }
        }
    } else {
        p.i += 1;
    }
    p.ws();
    if p.next() != Some(b'=') {
        return Err(bad("no ="));
    }
    p.ws();
    if p.peek() == Some(b'?') {
        return Ok(None);
    }
    let ret = if p.s[p.i..].starts_with(b"-1 ") {
        let rest = std::str::from_utf8(&p.s[p.i + 3..]).unwrap_or("");
        Err(rest.split_whitespace().next().unwrap_or("").to_owned())
    } else {
        Ok(p.val().map_err(|e| bad(&e))?)
    };
    Ok(Some(Call {
        name,
        args,
        ret,
        line: line.chars().take(300).collect(),
    }))
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek();
        self.i += 1;
        c
    }

    fn ws(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    /// A `"..."` string at the cursor, `\xHH` and the usual escapes decoded.
    fn string(&mut self) -> Result<Vec<u8>, String> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match self.next() {
                None => return Err("string not closed".into()),
                Some(b'"') => return Ok(out),
                Some(b'\\') => out.push(self.escape()?),
                Some(c) => out.push(c),
            }
        }
    }

    fn escape(&mut self) -> Result<u8, String> {
        Ok(match self.next() {
            Some(b'x') => {
                let hex = self
                    .s
                    .get(self.i..self.i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or("bad \\x escape")?;
                self.i += 2;
                hex
            }
            Some(b'n') => b'\n',
            Some(b't') => b'\t',
            Some(b'r') => b'\r',
            Some(b'v') => 0x0b,
            Some(b'f') => 0x0c,
            Some(c @ b'0'..=b'7') => {
                let mut n = u32::from(c - b'0');
                for _ in 0..2 {
                    match self.peek() {
                        Some(d @ b'0'..=b'7') => {
                            n = n * 8 + u32::from(d - b'0');
                            self.i += 1;
                        }
                        _ => break,
                    }
                }
                n as u8
            }
            Some(c) => c,
            None => return Err("escape at the end".into()),
        })
    }

    /// The `-y` path after a descriptor: `<...>`, hex-escaped.
    fn annotation(&mut self) -> Result<Vec<u8>, String> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match self.next() {
                None => return Err("path annotation not closed".into()),
                Some(b'>') => return Ok(out),
                Some(b'\\') => out.push(self.escape()?),
                Some(c) => out.push(c),
            }
        }
    }

    fn val(&mut self) -> Result<Val, String> {
        self.ws();
        match self.peek() {
            Some(b'"') => {
                let bytes = self.string()?;
                let cut = self.s[self.i..].starts_with(b"...");
                if cut {
                    self.i += 3;
                }
                Ok(Val::Str { bytes, cut })
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    match self.peek() {
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Val::List(items));
                        }
                        Some(b',') => self.i += 1,
                        None => return Err("list not closed".into()),
                        _ => items.push(self.val()?),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut fields = Vec::new();
                loop {
                    self.ws();
                    match self.peek() {
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Val::Struct(fields));
                        }
                        Some(b',') => self.i += 1,
                        None => return Err("struct not closed".into()),
                        _ => {
                            let start = self.i;
                            while !matches!(self.peek(), Some(b'=' | b',' | b'}') | None) {
                                self.i += 1;
                            }
                            let key = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                            if self.peek() == Some(b'=') {
                                self.i += 1;
                                let v = self.val()?;
                                fields.push((key, v));
                            } else {
                                fields.push((key, Val::Other(String::new())));
                            }
                        }
                    }
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                self.i += 1;
                while self.peek().is_some_and(|c| c.is_ascii_alphanumeric()) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                let n = parse_int(text).ok_or_else(|| format!("bad number {text}"))?;
                if self.peek() == Some(b'<') {
                    let mut path = self.annotation()?;
                    if self.s[self.i..].starts_with(b"(deleted)") {
                        self.i += "(deleted)".len();
                        path.extend_from_slice(b" (deleted)");
                    }
                    return Ok(Val::Fd { fd: n, path });
                }
                // `[0 => 4096]`-style updates and anything else after a
                // number are kept as text.
                Ok(Val::Int(n))
            }
            _ => {
                let start = self.i;
                let mut depth = 0i32;
                while let Some(c) = self.peek() {
                    match c {
                        b'(' | b'[' | b'{' => depth += 1,
                        b')' | b']' | b'}' if depth == 0 => break,
                        b')' | b']' | b'}' => depth -= 1,
                        b',' if depth == 0 => break,
                        _ => {}
                    }
                    self.i += 1;
                }
                Ok(Val::Other(
                    String::from_utf8_lossy(&self.s[start..self.i])
                        .trim()
                        .to_owned(),
                ))
            }
        }
    }
}

/// A number as strace prints it: decimal, `0x` hex, or `0` octal.
fn parse_int(text: &str) -> Option<i64> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, text),
    };
    let n = if let Some(h) = t.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else {
        t.parse().ok()?
    };
    Some(if neg { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_into_arguments_and_halves_join() {
        let text = "\
7 openat2(3<\\x2f\\x72>, \"\\x61\", {flags=0xa80c1, mode=0644, resolve=0xa}, 24) = 8<\\x2f\\x72\\x2f\\x61>
7 write(8<\\x2f\\x72\\x2f\\x61>, \"\\x68\\x69\" <unfinished ...>
9 fsync(3<\\x2f\\x72>) = 0
7 <... write resumed>, 2) = 2
9 unlinkat(3<\\x2f\\x72>, \"\\x62\", 0) = -1 ENOENT (No such file or directory)
9 renameat2(-100<\\x2f>, \"\\x61\", -100<\\x2f>, \"\\x62\", 0x2) = 0
9 exit_group(0) = ?
9 fcntl(6<\\x2f>, 0x1 <unfinished ...>) = ?
11 dup3(0<\\x2f>, -798298304, 0x124 <detached ...>
12 dup2(3<\\x2f>, 1 <unfinished ...>
12 <... dup2 resumed> <detached ...>
";
        let calls = parse(text).unwrap();
        let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["openat2", "fsync", "write", "unlinkat", "renameat2"],
            "a call takes its place where it completed"
        );
        let open = &calls[0];
        assert_eq!(
            open.args[0],
            Val::Fd {
                fd: 3,
                path: b"/r".to_vec()
            }
        );
        assert_eq!(
            open.args[2].field("flags"),
            Some(&Val::Int(0xa80c1)),
            "{open:?}"
        );
        assert_eq!(open.args[2].field("mode"), Some(&Val::Int(0o644)));
        assert_eq!(
            open.ret,
            Ok(Val::Fd {
                fd: 8,
                path: b"/r/a".to_vec()
            })
        );
        assert_eq!(
            calls[2].args[1],
            Val::Str {
                bytes: b"hi".to_vec(),
                cut: false
            }
        );
        assert_eq!(calls[2].ret, Ok(Val::Int(2)));
        assert_eq!(calls[3].ret, Err("ENOENT".to_owned()));
        assert_eq!(calls[4].args[4], Val::Int(2));
    }
}
