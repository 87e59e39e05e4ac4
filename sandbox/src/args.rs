//! The sandbox helper's command line, as one type: the launcher renders it
//! and `skillhost-sandbox sandbox-exec` parses it, so the two never drift
//! apart. A warm helper (`sandbox-warm`) gets the same line on its stdin,
//! framed by [`frame`].
//! Parsing is strict (an unknown flag, a missing value or a bad number is an
//! error that names it): the helper is internal, and anything but what the
//! launcher renders means a caller to refuse.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// The subcommand that runs the helper.
pub const SUBCOMMAND: &str = "sandbox-exec";

/// The subcommand of a helper started before its command is known: it
/// joins the control groups on its command line, then reads the rest of
/// its command line from stdin ([`frame`]) and runs it.
pub const WARM_SUBCOMMAND: &str = "sandbox-warm";

/// The most a framed command line on a warm helper's stdin may take. The
/// kernel caps one `execve` at about 2 MiB of arguments and environment
/// together; twice that leaves room for the framing and refuses a runaway.
pub const MAX_FRAMED_BYTES: usize = 4 * 1024 * 1024;

/// Everything the helper is told about one command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelperArgs {
    /// Folder holding the profiles.
    pub profile_dir: PathBuf,
    /// Profile name (a file `<name>.yaml` in the profile folder).
    pub profile: String,
    /// The working folder, read-write; HOME, PWD and TMPDIR point into it.
    pub workspace: PathBuf,
    /// A skill folder the command may read.
    pub skill: Option<PathBuf>,
    /// Files of the server's the command may read, such as the CA snapshot.
    pub read: Vec<PathBuf>,
    /// Let the command use the network.
    pub allow_network: bool,
    /// Run without the sandbox (the operator's explicit choice).
    pub unconfined: bool,
    /// Start in this folder directly inside the working folder instead of
    /// its top (one name; a link there is refused).
    pub start_in: Option<String>,
    /// Start in this host folder instead, which the command may then read
    /// and run from (an MCP server's configured `cwd`).
    pub cwd: Option<PathBuf>,
    /// Folders of the operator's the command may read and run from, never
    /// write (an MCP server's installed code, native modules included).
    pub execute: Vec<PathBuf>,
    /// An inherited Unix socket: give the command a network of its own and
    /// send the server a listener made in it, for the install proxy.
    pub proxy_channel: Option<i32>,
    /// User id to run as when started as root (the workspace's own).
    pub uid: Option<u32>,
    /// Group id to run as when started as root.
    pub gid: Option<u32>,
    /// Control group folders to join before dropping privileges.
    pub cgroups: Vec<PathBuf>,
    /// Set in the command's environment after everything else: the
    /// workspace's package folders, proxies.
    pub env: Vec<(String, String)>,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

/// Why a helper command line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelperArgsError {
    /// A flag the helper does not know.
    #[error("unknown argument '{0}'")]
    Unknown(String),
    /// A flag that takes a value came last.
    #[error("{0} needs a value")]
    NoValue(&'static str),
    /// A value that must be text or a number is not.
    #[error("{flag}: '{value}' is not {expected}")]
    BadValue { flag: &'static str, value: String, expected: &'static str },
    /// A flag every command line carries is absent.
    #[error("{0} is required")]
    Missing(&'static str),
    /// Nothing follows `--`, or there is no `--`.
    #[error("no command after '--'")]
    NoCommand,
    /// A framed command line that stops inside an argument.
    #[error("the command line on stdin stops inside an argument")]
    CutShort,
    /// A framed command line past [`MAX_FRAMED_BYTES`].
    #[error("the command line on stdin is longer than {MAX_FRAMED_BYTES} bytes")]
    TooLong,
}

/// A command line as bytes for a pipe: each argument as its length (4
/// bytes, little-endian) and its bytes. Unlike `execve`'s, the framing has
/// no terminator a value could contain.
pub fn frame(args: &[OsString]) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for arg in args {
        let bytes = arg.as_bytes();
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

/// The arguments [`frame`] wrote.
pub fn unframe(mut bytes: &[u8]) -> Result<Vec<OsString>, HelperArgsError> {
    use std::os::unix::ffi::OsStringExt;
    if bytes.len() > MAX_FRAMED_BYTES {
        return Err(HelperArgsError::TooLong);
    }
    let mut args = Vec::new();
    while !bytes.is_empty() {
        let (length, rest) = bytes.split_first_chunk::<4>().ok_or(HelperArgsError::CutShort)?;
        let length = u32::from_le_bytes(*length) as usize;
        if rest.len() < length {
            return Err(HelperArgsError::CutShort);
        }
        let (arg, rest) = rest.split_at(length);
        args.push(OsString::from_vec(arg.to_vec()));
        bytes = rest;
    }
    Ok(args)
}

/// A warm helper's own command line: the control groups it joins.
pub fn parse_warm(args: impl IntoIterator<Item = OsString>) -> Result<Vec<PathBuf>, HelperArgsError> {
    let mut args = args.into_iter();
    let mut groups = Vec::new();
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--cgroup") => groups.push(PathBuf::from(value(&mut args, "--cgroup")?)),
            _ => return Err(HelperArgsError::Unknown(arg.to_string_lossy().into_owned())),
        }
    }
    Ok(groups)
}

/// `NAME=VALUE`, with a name a shell could export.
fn parse_env(text: &str) -> Result<(String, String), HelperArgsError> {
    let refused = |expected| HelperArgsError::BadValue { flag: "--env", value: text.to_string(), expected };
    let (name, value) = text.split_once('=').ok_or_else(|| refused("NAME=VALUE"))?;
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(refused("a variable name"));
    }
    Ok((name.to_string(), value.to_string()))
}

impl HelperArgs {
    /// The arguments after the subcommand, in a fixed order.
    pub fn render(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: Option<&OsStr>| {
            out.push(name.into());
            out.extend(value.map(OsStr::to_os_string));
        };
        flag("--profile-dir", Some(self.profile_dir.as_os_str()));
        flag("--profile", Some(OsStr::new(&self.profile)));
        flag("--workspace", Some(self.workspace.as_os_str()));
        if let Some(uid) = self.uid {
            flag("--uid", Some(OsStr::new(&uid.to_string())));
        }
        if let Some(gid) = self.gid {
            flag("--gid", Some(OsStr::new(&gid.to_string())));
        }
        if let Some(skill) = &self.skill {
            flag("--skill", Some(skill.as_os_str()));
        }
        for path in &self.read {
            flag("--read", Some(path.as_os_str()));
        }
        if self.allow_network {
            flag("--allow-network", None);
        }
        if self.unconfined {
            flag("--unconfined", None);
        }
        if let Some(folder) = &self.start_in {
            flag("--start-in", Some(OsStr::new(folder)));
        }
        for path in &self.execute {
            flag("--execute", Some(path.as_os_str()));
        }
        if let Some(cwd) = &self.cwd {
            flag("--cwd", Some(cwd.as_os_str()));
        }
        if let Some(fd) = self.proxy_channel {
            flag("--proxy-channel", Some(OsStr::new(&fd.to_string())));
        }
        for dir in &self.cgroups {
            flag("--cgroup", Some(dir.as_os_str()));
        }
        for (name, value) in &self.env {
            flag("--env", Some(OsStr::new(&format!("{name}={value}"))));
        }
        flag("--", None);
        out.extend(self.command.iter().cloned());
        out
    }

    /// Reads the arguments after the subcommand.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, HelperArgsError> {
        let mut args = args.into_iter();
        let mut parsed = HelperArgs::default();
        let (mut profile_dir, mut profile, mut workspace) = (None, None, None);
        loop {
            let Some(arg) = args.next() else { return Err(HelperArgsError::NoCommand) };
            let Some(name) = arg.to_str() else {
                return Err(HelperArgsError::Unknown(arg.to_string_lossy().into_owned()));
            };
            if name == "--" {
                break;
            }
            match name {
                "--allow-network" => parsed.allow_network = true,
                "--unconfined" => parsed.unconfined = true,
                "--profile-dir" => profile_dir = Some(PathBuf::from(value(&mut args, "--profile-dir")?)),
                "--profile" => profile = Some(text(value(&mut args, "--profile")?, "--profile")?),
                "--workspace" => workspace = Some(PathBuf::from(value(&mut args, "--workspace")?)),
                "--skill" => parsed.skill = Some(PathBuf::from(value(&mut args, "--skill")?)),
                "--read" => parsed.read.push(PathBuf::from(value(&mut args, "--read")?)),
                "--start-in" => parsed.start_in = Some(text(value(&mut args, "--start-in")?, "--start-in")?),
                "--cwd" => parsed.cwd = Some(PathBuf::from(value(&mut args, "--cwd")?)),
                "--execute" => parsed.execute.push(PathBuf::from(value(&mut args, "--execute")?)),
                "--proxy-channel" => parsed.proxy_channel = Some(number(&mut args, "--proxy-channel")?),
                "--uid" => parsed.uid = Some(number(&mut args, "--uid")?),
                "--gid" => parsed.gid = Some(number(&mut args, "--gid")?),
                "--cgroup" => parsed.cgroups.push(PathBuf::from(value(&mut args, "--cgroup")?)),
                "--env" => {
                    let pair = text(value(&mut args, "--env")?, "--env")?;
                    parsed.env.push(parse_env(&pair)?);
                }
                other => return Err(HelperArgsError::Unknown(other.to_string())),
            }
        }
        parsed.command = args.collect();
        if parsed.command.is_empty() {
            return Err(HelperArgsError::NoCommand);
        }
        parsed.profile_dir = profile_dir.ok_or(HelperArgsError::Missing("--profile-dir"))?;
        parsed.profile = profile.ok_or(HelperArgsError::Missing("--profile"))?;
        parsed.workspace = workspace.ok_or(HelperArgsError::Missing("--workspace"))?;
        Ok(parsed)
    }
}

fn value(args: &mut impl Iterator<Item = OsString>, flag: &'static str) -> Result<OsString, HelperArgsError> {
    args.next().ok_or(HelperArgsError::NoValue(flag))
}

fn text(value: OsString, flag: &'static str) -> Result<String, HelperArgsError> {
    value.into_string().map_err(|value| HelperArgsError::BadValue {
        flag,
        value: value.to_string_lossy().into_owned(),
        expected: "UTF-8 text",
    })
}

fn number<T: std::str::FromStr>(
    args: &mut impl Iterator<Item = OsString>,
    flag: &'static str,
) -> Result<T, HelperArgsError> {
    let value = text(value(args, flag)?, flag)?;
    value.parse().map_err(|_| HelperArgsError::BadValue { flag, value, expected: "a number" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn full() -> HelperArgs {
        HelperArgs {
            profile_dir: "/run/profiles".into(),
            profile: "code-exec".into(),
            workspace: "/tmp/w/abc".into(),
            skill: Some("/skills/pdf".into()),
            read: vec!["/run/ca.pem".into(), "/run/other".into()],
            allow_network: true,
            unconfined: true,
            start_in: Some("node_modules".into()),
            cwd: Some("/srv/mcp".into()),
            execute: vec!["/srv/mcp/python".into()],
            proxy_channel: Some(7),
            uid: Some(1879048193),
            gid: Some(1879048193),
            cgroups: vec!["/sys/fs/cgroup/skillhost/c1".into()],
            env: vec![("PIP_TARGET".into(), "/w/.pkgs".into()), ("EMPTY".into(), String::new())],
            command: os(&["/bin/sh", "-c", "echo --unconfined -- x"]),
        }
    }

    #[test]
    fn what_is_rendered_parses_back_whole() {
        let minimal = HelperArgs {
            profile_dir: "/p".into(),
            profile: "skills-run".into(),
            workspace: "/w".into(),
            command: os(&["true"]),
            ..HelperArgs::default()
        };
        for args in [full(), minimal] {
            assert_eq!(HelperArgs::parse(args.render()).unwrap(), args);
        }
    }

    #[test]
    fn the_rendered_line_of_a_full_command() {
        let expected = "--profile-dir /run/profiles --profile code-exec --workspace /tmp/w/abc --uid 1879048193 \
                        --gid 1879048193 --skill /skills/pdf --read /run/ca.pem --read /run/other --allow-network \
                        --unconfined --start-in node_modules --execute /srv/mcp/python --cwd /srv/mcp --proxy-channel 7 \
                        --cgroup /sys/fs/cgroup/skillhost/c1 \
                        --env PIP_TARGET=/w/.pkgs --env EMPTY= -- /bin/sh -c echo --unconfined -- x";
        let rendered: Vec<String> = full().render().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(rendered.join(" "), expected);
    }

    #[test]
    fn refusals_name_what_was_wrong() {
        let base = ["--profile-dir", "/p", "--profile", "x", "--workspace", "/w"];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            HelperArgs::parse(os(&args)).unwrap_err()
        };
        let cases: Vec<(HelperArgsError, HelperArgsError, &str)> = vec![
            (
                with(&["--bogus", "--", "true"]),
                HelperArgsError::Unknown("--bogus".into()),
                "unknown argument '--bogus'",
            ),
            (with(&["--uid"]), HelperArgsError::NoValue("--uid"), "--uid needs a value"),
            (
                with(&["--uid", "root", "--", "true"]),
                HelperArgsError::BadValue { flag: "--uid", value: "root".into(), expected: "a number" },
                "--uid: 'root' is not a number",
            ),
            (
                with(&["--env", "1X=2", "--", "true"]),
                HelperArgsError::BadValue { flag: "--env", value: "1X=2".into(), expected: "a variable name" },
                "--env: '1X=2' is not a variable name",
            ),
            (
                with(&["--env", "NOVALUE", "--", "true"]),
                HelperArgsError::BadValue { flag: "--env", value: "NOVALUE".into(), expected: "NAME=VALUE" },
                "--env: 'NOVALUE' is not NAME=VALUE",
            ),
            (with(&["--"]), HelperArgsError::NoCommand, "no command after '--'"),
            (with(&[]), HelperArgsError::NoCommand, "no command after '--'"),
            (
                HelperArgs::parse(os(&["--profile", "x", "--workspace", "/w", "--", "true"])).unwrap_err(),
                HelperArgsError::Missing("--profile-dir"),
                "--profile-dir is required",
            ),
        ];
        for (got, expected, message) in cases {
            assert_eq!(got, expected);
            assert_eq!(got.to_string(), message);
        }
    }

    #[test]
    fn a_framed_line_comes_back_whole_with_any_bytes_in_it() {
        use std::os::unix::ffi::OsStringExt;
        let mut args = full().render();
        args.push(OsString::from_vec(vec![0, b'\n', 0xff, b' ']));
        args.push(OsString::new());
        assert_eq!(unframe(&frame(&args)).unwrap(), args);
        assert_eq!(HelperArgs::parse(unframe(&frame(&full().render())).unwrap()).unwrap(), full());
    }

    #[test]
    fn a_framed_line_cut_short_or_too_long_is_refused() {
        let framed = frame(&os(&["--profile", "code-exec"]));
        for cut in [1, 4, framed.len() - 1] {
            assert_eq!(unframe(&framed[..cut]), Err(HelperArgsError::CutShort), "cut at {cut}");
        }
        let mut claims_more = 10u32.to_le_bytes().to_vec();
        claims_more.extend_from_slice(b"short");
        assert_eq!(unframe(&claims_more), Err(HelperArgsError::CutShort));
        // At the limit: one argument filling it exactly; one byte past.
        let at = vec![OsString::from("x".repeat(MAX_FRAMED_BYTES - 4))];
        assert_eq!(unframe(&frame(&at)).unwrap(), at);
        let past = vec![OsString::from("x".repeat(MAX_FRAMED_BYTES - 3))];
        assert_eq!(unframe(&frame(&past)), Err(HelperArgsError::TooLong));
    }

    #[test]
    fn a_warm_line_carries_only_control_groups() {
        assert_eq!(
            parse_warm(os(&["--cgroup", "/a", "--cgroup", "/b"])).unwrap(),
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(parse_warm(os(&[])).unwrap(), Vec::<PathBuf>::new());
        assert_eq!(parse_warm(os(&["--cgroup"])), Err(HelperArgsError::NoValue("--cgroup")));
        assert_eq!(parse_warm(os(&["--uid", "0"])), Err(HelperArgsError::Unknown("--uid".into())));
    }
}
