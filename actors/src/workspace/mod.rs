//! Workspaces: the private folder a request's code tools work in, and the
//! file tools themselves.

pub mod apply_patch;
pub mod conversations;
pub mod files;
pub mod syntax;

use std::path::{Path, PathBuf};

/// A private folder, deleted when dropped.
#[derive(Debug)]
pub struct Workspace {
    dir: tempfile::TempDir,
    /// The sandbox user's uid and gid when the server runs as root: files the
    /// server writes are handed to it so sandboxed commands can change them.
    owner: Option<(u32, u32)>,
}

impl Workspace {
    /// Creates a workspace under `base`.
    pub fn create(base: &Path, owner: Option<(u32, u32)>) -> std::io::Result<Workspace> {
        std::fs::create_dir_all(base)?;
        let dir = tempfile::Builder::new().prefix("ws-").tempdir_in(base)?;
        let workspace = Workspace { dir, owner };
        workspace.hand_over(workspace.root());
        Ok(workspace)
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Gives a path the server created (and its folders up to the root) to
    /// the sandbox user.
    pub fn hand_over(&self, path: &Path) {
        let Some((uid, gid)) = self.owner else { return };
        let mut at: Option<PathBuf> = Some(path.to_path_buf());
        while let Some(current) = at {
            if !current.starts_with(self.root()) {
                break;
            }
            let _ = std::os::unix::fs::lchown(&current, Some(uid), Some(gid));
            at = current.parent().map(Path::to_path_buf);
        }
    }
}

/// The uid and gid of `user` when this process is root (commands then run as
/// that user); `None` otherwise.
pub fn sandbox_owner(user: &str) -> Option<(u32, u32)> {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new(user).ok()?;
    // SAFETY: getpwnam returns static storage or null; read immediately.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return None;
    }
    // SAFETY: non-null passwd record.
    Some(unsafe { ((*entry).pw_uid, (*entry).pw_gid) })
}

/// The first folder on the way to `path` that the sandbox user cannot pass
/// through. Commands run as that user and their workspace is mounted by its
/// path, so a private folder anywhere above it (a root-only home or
/// `/tmp/pytest-of-root`) stops every command; start-up names it instead.
pub fn unreachable_ancestor(path: &Path, (uid, gid): (u32, u32)) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    for dir in path.ancestors() {
        let Ok(meta) = std::fs::metadata(dir) else { return Some(dir.to_path_buf()) };
        let mode = meta.mode();
        let search = if meta.uid() == uid {
            mode & 0o100
        } else if meta.gid() == gid {
            mode & 0o010
        } else {
            mode & 0o001
        };
        if search == 0 {
            return Some(dir.to_path_buf());
        }
    }
    None
}

/// Tool names of the code tools.
pub const READ_FILE: &str = "read_file";
pub const WRITE_FILE: &str = "write_file";
pub const APPLY_PATCH: &str = "apply_patch";
pub const SHELL: &str = "shell";
/// Older spellings models still use; answered, never declared.
pub const EDIT_ALIASES: [&str; 2] = ["edit_file", "str_replace"];

/// Whether a tool name is one of the code tools (aliases included).
pub fn is_code_tool(name: &str) -> bool {
    matches!(name, READ_FILE | WRITE_FILE | APPLY_PATCH | SHELL) || EDIT_ALIASES.contains(&name)
}

/// The fixed part of the prompt when the code tools are declared: it
/// depends on nothing but that, so the prompt prefix stays stable.
pub const CODE_PROMPT: &str = "## Working with files\nYou have a private working folder for this request. Create a new file with write_file. Change an existing file, even by one line, with apply_patch: read the lines first, then send the smallest patch whose context matches them exactly. Run commands with shell; the folder and exported variables carry over between commands. When a tool says a file now holds what you wrote, do not read it back.";

/// The code tools' declarations; flat scalar parameters only.
pub fn declarations() -> Vec<skillhost_engine::ToolDef> {
    use serde_json::json;
    use skillhost_engine::ToolDef;
    vec![
        ToolDef {
            name: READ_FILE.into(),
            description: "Show a file of the working folder with line numbers.".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "File path, relative to the working folder."},
                "offset": {"type": "integer", "description": "First line to show (1-based)."},
                "limit": {"type": "integer", "description": "How many lines to show."}
            }, "required": ["path"]}),
        },
        ToolDef {
            name: WRITE_FILE.into(),
            description: "Create a new file. It refuses a path that exists: change existing files with apply_patch.".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "File path, relative to the working folder."},
                "content": {"type": "string", "description": "The whole content of the new file."}
            }, "required": ["path", "content"]}),
        },
        ToolDef {
            name: APPLY_PATCH.into(),
            description: "Change, add, move or delete files with a patch: '*** Begin Patch', then sections '*** Update File: path' (with '@@' anchors and ' ', '-', '+' lines), '*** Add File: path' ('+' lines), '*** Delete File: path', then '*** End Patch'. All or nothing.".into(),
            parameters: json!({"type": "object", "properties": {
                "input": {"type": "string", "description": "The whole patch, from '*** Begin Patch' to '*** End Patch'."}
            }, "required": ["input"]}),
        },
        ToolDef {
            name: SHELL.into(),
            description: "Run a bash command in the working folder, sandboxed and offline. Returns its output and exit status.".into(),
            parameters: json!({"type": "object", "properties": {
                "command": {"type": "string", "description": "The command line."},
                "timeout_ms": {"type": "integer", "description": "Deadline in milliseconds (default 60000)."}
            }, "required": ["command"]}),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_private_folder_above_the_workspace_is_named() {
        let base = tempfile::tempdir().unwrap();
        let private = base.path().join("private");
        let inner = private.join("work");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Some other user: not the owner and not in the group.
        let other = (u32::MAX - 7, u32::MAX - 7);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(unreachable_ancestor(&inner, other), Some(private.clone()));
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(unreachable_ancestor(&inner, other), None);
    }
}
