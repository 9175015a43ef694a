"""The declaration repo, a bare git repository read and merged with GitPython.

People clone it, push branches and propose them; the gateway never needs a work tree: it reads
trees at exact commits, and merges with `git merge-tree --write-tree` and `commit-tree`.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import git
from git.exc import BadName, GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.domain.errors import BackendError, Conflict, NotFound, RefMoved
from gateway.domain.repo_settings import RepoSettings
from gateway.ports import CommitInfo


class GitDeclarationRepo:
    def __init__(self, path: Path):
        try:
            self.repo = git.Repo(path)
        except (InvalidGitRepositoryError, NoSuchPathError):
            raise NotFound(f"no declaration repo at {path}: run `gateway init` first") from None
        self.path = path

    @classmethod
    def create(cls, path: Path, content: Path, main_branch: str = "main") -> GitDeclarationRepo:
        """A new bare repo whose first commit on `main_branch` holds the files of `content`."""
        git.Repo.init(path, bare=True, initial_branch=main_branch)
        with tempfile.TemporaryDirectory() as tmp:
            clone = git.Repo.clone_from(str(path), tmp)
            shutil.copytree(content, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            clone.git.checkout("-b", main_branch)
            clone.git.add("-A")
            clone.git.execute(["git", "commit", "-q", "-m", "Initial declarations"], env=committer_env())
            clone.git.push("origin", main_branch)
        return cls(path)

    def reopen(self) -> GitDeclarationRepo:
        """A handle of its own (GitPython's are not thread-safe)."""
        return GitDeclarationRepo(self.path)

    def main_branch(self) -> str:
        """The repo's default branch (HEAD of the bare repo), whose rules bind every proposal."""
        return str(self.repo.head.reference.name) if not self.repo.head.is_detached else "main"

    def resolve(self, ref: str) -> str:
        """The commit SHA a branch, tag or SHA names."""
        try:
            return self.repo.commit(ref).hexsha
        except (BadName, ValueError, GitCommandError):
            raise NotFound(f"unknown git ref {ref!r} in the declaration repo") from None

    def branch_exists(self, branch: str) -> bool:
        return branch in {h.name for h in self.repo.branches}

    def repo_settings(self, sha: str) -> RepoSettings:
        """gateway.yaml at `sha` (parsed once per content)."""
        return parse_repo_settings(self.read_file(sha, "gateway.yaml"))

    def merge_base(self, a: str, b: str) -> str:
        bases = self.repo.merge_base(a, b)
        if not bases:
            raise Conflict(f"{a} and {b} have no common history")
        return bases[0].hexsha

    def changed_paths(self, base: str, head: str) -> list[str]:
        """Every path added, changed, removed or renamed between two commits (cached: commits never change)."""
        return list(_cached_changed_paths(str(self.path), self.resolve(base), self.resolve(head)))

    def diff(self, base: str, head: str) -> str:
        """The text diff between two commits (cached: commits never change, and every page view shows it)."""
        return _cached_diff(str(self.path), self.resolve(base), self.resolve(head))

    def commits(self, base: str, head: str) -> list[CommitInfo]:
        """The commits in `base..head`, oldest first."""
        return [CommitInfo(c.hexsha, str(c.author.name or "unknown"), str(c.author.email or ""), str(c.message))
                for c in reversed(list(self.repo.iter_commits(f"{base}..{head}")))]

    def read_file(self, sha: str, path: str) -> str:
        try:
            blob = self.repo.commit(sha).tree / path
        except KeyError:
            raise NotFound(f"{path} does not exist at {sha[:12]}") from None
        return blob.data_stream.read().decode("utf-8")

    def read_files(self, sha: str, subdir: str, suffix: str) -> dict[str, str]:
        """The text of each file directly under `subdir` at `sha` whose name ends with `suffix` (symlinks skipped)."""
        try:
            tree = self.repo.commit(sha).tree / subdir
        except KeyError:
            return {}
        return {f"{subdir}/{blob.name}": blob.data_stream.read().decode("utf-8")
                for blob in tree.blobs if blob.name.endswith(suffix) and blob.mode != blob.link_mode}

    def read_tree(self, sha: str, subdir: str) -> dict[str, str]:
        """The text of every file under `subdir` at `sha`, recursively (symlinks and non-UTF-8 files skipped)."""
        try:
            tree = self.repo.commit(sha).tree / subdir
        except KeyError:
            return {}
        out = {}
        for item in tree.traverse():
            if item.type == "blob" and item.mode != item.link_mode:
                try:
                    out[item.path] = item.data_stream.read().decode("utf-8")
                except UnicodeDecodeError:
                    continue
        return out

    def export(self, sha: str, subdir: str, dest: Path) -> Path:
        """Write the files under `subdir` at commit `sha` into `dest` (not recursing into subfolders' git links)."""
        try:
            tree = self.repo.commit(sha).tree / subdir
        except KeyError:
            raise NotFound(f"{subdir} does not exist at {sha[:12]}") from None
        dest.mkdir(parents=True, exist_ok=True)
        for item in tree.traverse():
            target = dest / Path(item.path).relative_to(subdir)
            if item.type == "tree":
                target.mkdir(parents=True, exist_ok=True)
            elif item.type == "blob":
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(item.data_stream.read())
        return dest

    def module_directories(self, sha: str, stack_path: str) -> tuple[str, ...]:
        """The local module directories the stack at `stack_path` calls at `sha` (see adapters/module_sources.py)."""
        return _cached_module_directories(str(self.path), self.resolve(sha), stack_path)

    def export_stack(self, sha: str, stack_path: str, dest: Path) -> Path:
        """Write a stack and the local modules it calls at `sha` under `dest` as the repo lays them out (with
        gateway.yaml, which marks the top a `../` source may reach); returns the stack's directory."""
        directory = self.export(sha, stack_path, dest / stack_path)
        for module in self.module_directories(sha, stack_path):
            try:
                self.export(sha, module, dest / module)
            except NotFound:
                continue  # the engine names the call whose source does not exist
        try:
            (dest / "gateway.yaml").write_text(self.read_file(sha, "gateway.yaml"))
        except NotFound:
            (dest / "gateway.yaml").write_text("")
        return directory

    def merge_preview(self, main_sha: str, head_sha: str) -> str:
        """A commit holding the merge of `head_sha` into `main_sha`, on no branch: what main would become.

        Plans are made from it, so an approval covers what main will describe after the merge.
        """
        tree = self._merge_tree(main_sha, head_sha)
        return self._git("commit-tree", tree, "-p", main_sha, "-p", head_sha, "-m", "merge preview",
                         env=committer_env())

    def first_parent_commits(self, since: str, until: str) -> list[tuple[str, str | None, str]]:
        """(sha, first parent, author) of each commit on `until`'s first-parent line after `since`, oldest first."""
        out = self._git("log", "--first-parent", "--reverse", "--format=%H %P%x09%an <%ae>", f"{since}..{until}")
        commits = []
        for line in out.splitlines():
            shas, _, author = line.partition("\t")
            sha, *parents = shas.split()
            commits.append((sha, parents[0] if parents else None, author))
        return commits

    def is_ancestor(self, older: str, newer: str) -> bool:
        return bool(self.repo.is_ancestor(older, newer))

    def merged_as(self, sha: str, ref: str) -> str | None:
        """The oldest commit on `ref`'s first-parent line that contains `sha` (its merge), or None if none does."""
        tip = self.resolve(ref)
        if not self.is_ancestor(sha, tip):
            return None
        line = self._git("rev-list", "--first-parent", "--ancestry-path", "--reverse", f"{sha}..{tip}").split()
        return line[0] if line else tip

    def last_commit_touching(self, ref: str, path: str) -> str | None:
        """The newest commit on `ref` that changed `path` (what made a setting what it is)."""
        sha = self._git("log", "-1", "--format=%H", ref, "--", path).strip()
        return sha or None

    def commits_touching(self, ref: str, path: str, limit: int = 20) -> list[str]:
        """The newest `limit` commits on `ref` that changed `path`, newest first."""
        return self._git("log", f"-{limit}", "--format=%H", ref, "--", path).split()

    def tree_of(self, sha: str, subdir: str) -> str | None:
        """The tree id of `subdir` at `sha` (None when it does not exist): equal ids, equal files."""
        try:
            return str((self.repo.commit(sha).tree / subdir).hexsha)
        except KeyError:
            return None

    def merge(self, main_sha: str, head_sha: str, into: str, message: str,
              before_moving: Callable[[str], None] | None = None) -> str:
        """Merge `head_sha` into branch `into`, which must still be at `main_sha`; refuse on conflicts.

        The ref moves only if nobody moved it meanwhile (update-ref's compare-and-swap); `before_moving` learns the
        merge commit first (the gateway records it as its own). Returns the new SHA.
        """
        tree = self._merge_tree(main_sha, head_sha)
        commit = self._git("commit-tree", tree, "-p", main_sha, "-p", head_sha, "-m", message, env=committer_env())
        if before_moving is not None:
            before_moving(commit)
        try:
            self._git("update-ref", f"refs/heads/{into}", commit, main_sha)
        except BackendError as exc:
            raise RefMoved(f"{into} moved while merging; it is no longer at {main_sha[:12]}") from exc
        return commit

    def commit_to_new_branch(self, base_sha: str, branch: str, files: dict[str, str], message: str,
                             author: str) -> str:
        """A new branch at `base_sha` plus one commit writing `files` (path -> content); refuse an existing branch."""
        def write(work: Path) -> None:
            for relative, content in files.items():
                (work / relative).write_text(content)
            self._git("-C", str(work), "add", "-A", "--", *files)
            self._git("-C", str(work), "commit", "-q", "-m", message, env=committer_env(author, f"{author}@gateway"))
        return self._in_worktree(base_sha, branch, write)

    def revert_merge_to_new_branch(self, merge_sha: str, onto_sha: str, branch: str, message: str,
                                   author: str) -> str:
        """A new branch at `onto_sha` plus a commit reverting merge `merge_sha` (its first parent is the mainline)."""
        def revert(work: Path) -> None:
            try:
                mainline = ["-m", "1"] if len(self.repo.commit(merge_sha).parents) > 1 else []  # squash: one parent
                self._git("-C", str(work), "revert", "--no-edit", *mainline, merge_sha,
                          env=committer_env(author, f"{author}@gateway"))
            except BackendError as exc:
                raise Conflict(f"the merge {merge_sha[:12]} no longer reverts cleanly on main "
                               f"(later changes touch the same lines); write the rollback by hand") from exc
            self._git("-C", str(work), "commit", "-q", "--amend", "-m", message,
                      env=committer_env(author, f"{author}@gateway"))
        return self._in_worktree(onto_sha, branch, revert)

    def set_branch(self, branch: str, sha: str) -> None:
        self._git("update-ref", f"refs/heads/{branch}", sha)

    def delete_branch(self, branch: str) -> None:
        self._git("update-ref", "-d", f"refs/heads/{branch}")

    def _in_worktree(self, base_sha: str, branch: str, work: Callable[[Path], None]) -> str:
        if self.branch_exists(branch):
            raise Conflict(f"branch {branch} already exists in the declaration repo")
        with tempfile.TemporaryDirectory(prefix="gw-work-") as tmp:
            path = Path(tmp) / "work"
            self._git("worktree", "add", "-q", "-b", branch, str(path), base_sha)
            try:
                work(path)
                return self.resolve(branch)
            except BaseException:
                self._git("worktree", "remove", "--force", str(path))
                self.delete_branch(branch)
                raise
            finally:
                if path.exists():
                    self._git("worktree", "remove", "--force", str(path))

    def _merge_tree(self, main_sha: str, head_sha: str) -> str:
        try:
            return self._git("merge-tree", "--write-tree", main_sha, head_sha).splitlines()[0]
        except BackendError as exc:
            conflicts = [line.split("\t", 1)[-1] for line in (exc.__cause__.stdout if isinstance(
                exc.__cause__, GitCommandError) else "").splitlines() if "\t" in line]
            where = f" (conflicts in {', '.join(sorted(set(conflicts)))})" if conflicts else ""
            raise Conflict(f"the branch does not merge cleanly into main{where}; "
                           "rebase it on main and push again") from exc

    def _git(self, *args: str, env: dict[str, str] | None = None) -> str:
        try:
            return str(self.repo.git.execute(["git", *args], env=env))
        except GitCommandError as exc:
            raise BackendError(f"git {args[0]} failed: {exc.stderr.strip() or exc}") from exc


@functools.lru_cache(maxsize=1024)
def _cached_changed_paths(path: str, base: str, head: str) -> tuple[str, ...]:
    try:
        out = str(git.Repo(path).git.execute(["git", "diff", "--name-only", "--no-renames", base, head]))
    except GitCommandError as exc:
        raise BackendError(f"git diff failed: {exc.stderr.strip() or exc}") from exc
    return tuple(sorted(p for p in out.splitlines() if p))


@functools.lru_cache(maxsize=4096)
def _cached_module_directories(path: str, sha: str, stack_path: str) -> tuple[str, ...]:
    from gateway.adapters.module_sources import local_module_directories  # the HCL parser, only when asked

    repo = GitDeclarationRepo(Path(path))
    return local_module_directories(stack_path, lambda directory: repo.read_files(sha, directory, ".tf"))


@functools.lru_cache(maxsize=128)
def _cached_diff(path: str, base: str, head: str) -> str:
    try:
        return str(git.Repo(path).git.execute(["git", "diff", base, head]))
    except GitCommandError as exc:
        raise BackendError(f"git diff failed: {exc.stderr.strip() or exc}") from exc


def committer_env(name: str = "change-gateway", email: str = "gateway@localhost") -> dict[str, str]:
    """Git identity for commits the gateway makes; the machine may have none configured."""
    return {
        **os.environ,
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
