"""Working copies of the declaration repo on disk (GitPython), where agents edit files.

Commits are made with the gateway as committer and the agent as author; only what is pushed leaves the copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gateway.adapters.git.repo import committer_env

if TYPE_CHECKING:
    import git


class GitWorkingCopy:
    def __init__(self, clone: git.Repo):
        self.clone = clone
        self.root = Path(clone.working_dir)

    def is_dirty(self) -> bool:
        return bool(self.clone.is_dirty(untracked_files=True))

    def new_branch(self, branch: str) -> None:
        self.clone.git.checkout("-q", "-b", branch)

    def commit_and_push(self, message: str, author: str, ref: str, force: bool = False) -> None:
        self.clone.git.add("-A")
        self.clone.git.execute(["git", "commit", "-q", "-m", message], env=committer_env(author, f"{author}@gateway.local"))
        self.clone.git.push("-q", *(["-f"] if force else []), "origin", f"HEAD:{ref}")

    def fetch(self, ref: str) -> tuple[str, str | None] | None:
        import git

        try:
            self.clone.git.fetch("-q", "origin", f"+{ref}:{ref}")
        except git.GitCommandError:
            return None
        commit = self.clone.commit(ref)
        return commit.hexsha, (commit.parents[0].hexsha if commit.parents else None)

    def head(self) -> str:
        return str(self.clone.head.commit.hexsha)

    def uncommit_onto(self, ref: str) -> list[str]:
        self.clone.git.checkout("-q", "-B", self.clone.active_branch.name, ref)
        self.clone.git.reset("-q", "--mixed", "HEAD~1")
        return sorted(line[3:] for line in self.clone.git.status("--porcelain", "-uall").splitlines() if line.strip())

    def delete_remote(self, ref: str) -> None:
        self.clone.git.push("-q", "origin", f":{ref}")


class GitWorkingCopies:
    def __init__(self, repo_path: Path):
        self.repo_path = repo_path

    def clone(self, dest: Path, branch: str | None = None, at: str | None = None) -> GitWorkingCopy:
        import git  # GitPython only where an agent edits, never for a read

        source = str(self.repo_path.resolve())
        if at is not None:
            clone = git.Repo.clone_from(source, dest, no_checkout=True)
            clone.git.checkout("-q", at)
            return GitWorkingCopy(clone)
        clone = git.Repo.clone_from(source, dest)
        if branch is not None:
            remote = f"origin/{branch}"
            if any(r.name == remote for r in clone.remotes.origin.refs):
                clone.git.checkout("-B", branch, remote)
            else:
                clone.git.checkout("-b", branch)
        return GitWorkingCopy(clone)
