//! Which directories hold skills when the operator names none.

use std::path::{Path, PathBuf};

use super::registry::Root;
use super::skill::Origin;

/// Every existing `.agents/skills` from `cwd` up to the root of the Git
/// repository containing it, nearest first; outside a repository, only
/// `cwd`'s own. Personal folders (like `~/.agents/skills`) are never loaded
/// implicitly.
pub fn agents_skill_dirs(cwd: &Path) -> Vec<PathBuf> {
    let repository = cwd.ancestors().find(|dir| dir.join(".git").exists());
    let searched: Vec<&Path> = match repository {
        Some(top) => cwd.ancestors().take_while(|dir| dir.starts_with(top)).collect(),
        None => vec![cwd],
    };
    searched.into_iter().map(|dir| dir.join(".agents/skills")).filter(|dir| dir.is_dir()).collect()
}

/// The registry's roots in precedence order: the install directory first
/// (its skills are `installed`), then `explicit` roots if any were given,
/// else the `.agents/skills` defaults.
pub fn registry_roots(install_dir: Option<&Path>, explicit: &[PathBuf], cwd: &Path) -> Vec<Root> {
    let mut roots = Vec::new();
    if let Some(dir) = install_dir {
        roots.push(Root { path: dir.to_path_buf(), origin: Origin::Installed });
    }
    let discovered = if explicit.is_empty() { agents_skill_dirs(cwd) } else { explicit.to_vec() };
    for path in discovered {
        // The install directory named again as a root is still one root.
        if install_dir.is_some_and(|dir| same_dir(dir, &path)) {
            continue;
        }
        roots.push(Root { path, origin: Origin::Discovered });
    }
    roots
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_dirs_up_to_the_repository_root() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("outer/repo");
        let cwd = top.join("crates/app");
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::create_dir_all(top.join(".git")).unwrap();
        for at in [dir.path().join("outer"), top.clone(), cwd.clone()] {
            std::fs::create_dir_all(at.join(".agents/skills")).unwrap();
        }
        // Nearest first; nothing above the repository root.
        assert_eq!(agents_skill_dirs(&cwd), vec![cwd.join(".agents/skills"), top.join(".agents/skills")]);
        // Outside a repository only the working directory counts.
        let loose = dir.path().join("outer");
        assert_eq!(agents_skill_dirs(&loose), vec![loose.join(".agents/skills")]);
        let roots = registry_roots(Some(&dir.path().join("uploads")), &[], &cwd);
        let origins: Vec<Origin> = roots.iter().map(|r| r.origin).collect();
        assert_eq!(origins, vec![Origin::Installed, Origin::Discovered, Origin::Discovered]);
        let explicit = registry_roots(None, &[dir.path().to_path_buf()], &cwd);
        assert_eq!(explicit, vec![Root { path: dir.path().to_path_buf(), origin: Origin::Discovered }]);
    }
}
