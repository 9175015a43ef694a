"""The declaration repo, a bare git repository: read in-process with pygit2, written with GitPython.

People clone it, push branches and propose them; the gateway never needs a work tree: it reads
trees at exact commits, and merges with `git merge-tree --write-tree` and `commit-tree`.

Reads spawn no process (every page and API read goes through them): refs are resolved fresh by libgit2
reading the refs files and packed-refs, and what is at a commit (a tree, a file, a diff, gateway.yaml
parsed) is kept by object id, since it never changes. Writes and the log walks go through the `git` CLI.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pygit2
from pygit2.enums import DiffOption, FileMode, ObjectType, RepositoryOpenFlag, SortMode

from gateway.adapters.gateway_yaml import parse_repo_settings
from gateway.domain.errors import BackendError, Conflict, NotFound, RefMoved
from gateway.domain.repo_settings import RepoSettings
from gateway.domain.repositories import DEFAULT_REPOSITORY, qualified
from gateway.ports import CommitInfo

if TYPE_CHECKING:
    import git

_T = TypeVar("_T")
ADDING = "gateway.adding"  # a bare repository's config, while `gateway repos add` makes it: the name it is added as


class GitDeclarationRepo:
    """Reads are safe from any thread (a libgit2 handle per thread); writes are not (GitPython's handle)."""

    def __init__(self, path: Path, repository: str = DEFAULT_REPOSITORY):
        try:
            _open(path)
        except pygit2.GitError:
            raise NotFound(f"no declaration repo at {path}: run `gateway init` first") from None
        self.path = path
        self.repository = repository  # whose stacks gateway.yaml names (`repo/stack` but in the default one)
        self._local = threading.local()
        self._writer: git.Repo | None = None
        self._pins: dict[tuple[str, ...], Any] | None = None  # a pinned read's refs, as first read

    @property
    def repo(self) -> git.Repo:
        """The GitPython handle, made on the first write (it starts `git cat-file` processes when it reads)."""
        if self._writer is None:
            import git  # GitPython only where the gateway writes (a read needs libgit2 alone)
            from git.exc import InvalidGitRepositoryError, NoSuchPathError

            try:
                self._writer = git.Repo(self.path)
            except (InvalidGitRepositoryError, NoSuchPathError):
                raise NotFound(f"no declaration repo at {self.path}: run `gateway init` first") from None
        return self._writer

    @property
    def _reader(self) -> pygit2.Repository:
        reader: pygit2.Repository | None = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = _open(self.path)
        return reader

    @classmethod
    def create(cls, path: Path, content: Path, main_branch: str = "main",
               repository: str = DEFAULT_REPOSITORY, adding: bool = False) -> GitDeclarationRepo:
        """A new bare repo whose first commit on `main_branch` holds the files of `content` (`content` a git checkout:
        `main_branch` is its HEAD, history and all; what is not committed there is left out); `adding`: marked as the
        gateway's own unfinished work from its first moment, until `finish_adding` (see `left_unfinished`)."""
        import git

        bare = git.Repo.init(path, bare=True, initial_branch=main_branch)
        if adding:
            _open(path).config[ADDING] = repository
        if (content / ".git").exists():
            bare.git.fetch("--quiet", "--no-tags", str(content), f"HEAD:refs/heads/{main_branch}")
            return cls(path, repository)
        with tempfile.TemporaryDirectory() as tmp:
            clone = git.Repo.clone_from(str(path), tmp)
            shutil.copytree(content, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            clone.git.checkout("-b", main_branch)
            clone.git.add("-A")
            clone.git.execute(["git", "commit", "-q", "-m", "Initial declarations"], env=committer_env())
            clone.git.push("origin", main_branch)
        return cls(path, repository)

    @staticmethod
    def left_unfinished(path: Path, repository: str) -> bool:
        """Whether `path` is a bare repository the gateway began to add as `repository` and never registered (a
        process that died between the two): its own config says so, which no folder put there by anyone else does."""
        try:
            _open(path)  # a git repository at all, before its config file is read as one
            return pygit2.Config(str(path / "config"))[ADDING] == repository  # its own file: not ~/.gitconfig's
        except (pygit2.GitError, KeyError, OSError):
            return False

    def finish_adding(self) -> None:
        """Clear the mark `create(adding=True)` left: the repository is registered, no longer unfinished work."""
        config = pygit2.Config(str(self.path / "config"))
        if ADDING in config:
            del config[ADDING]

    def reopen(self) -> GitDeclarationRepo:
        """A handle of its own for writes (GitPython's are not thread-safe); its reads share this one's libgit2
        handles, one per thread, so a request opens no repository (opening one costs a small read a tenth)."""
        twin = object.__new__(GitDeclarationRepo)
        twin.path, twin._local, twin._writer, twin._pins = self.path, self._local, None, None
        twin.repository = self.repository
        return twin

    def pinned(self) -> GitDeclarationRepo:
        """A handle for one read: each ref is read from the refs once, then answered the same for the rest of the
        read, which so sees one moment of the refs (as its one transaction sees one moment of the database).
        A view asks for main half a dozen times; each lookup reads the refs files again."""
        twin = self.reopen()
        twin._pins = {}
        return twin

    def main_branch(self) -> str:
        """The repo's default branch (HEAD of the bare repo), whose rules bind every proposal."""
        return self._pinned(("main",), self._main_branch)

    def _main_branch(self) -> str:
        head = self._reader.references.get("HEAD")
        target = head.target if head is not None else None
        return target.removeprefix("refs/heads/") if isinstance(target, str) else "main"

    def resolve(self, ref: str) -> str:
        """The commit SHA a branch, tag or SHA names (read fresh from the refs on every call, but in a pinned read)."""
        return self._pinned(("resolve", ref), lambda: self._resolve(ref))

    def _resolve(self, ref: str) -> str:
        try:
            return str(self._reader.revparse_single(ref).peel(pygit2.Commit).id)
        except (KeyError, ValueError, pygit2.GitError):
            raise NotFound(f"unknown git ref {ref!r} in the declaration repo") from None

    def branch_exists(self, branch: str) -> bool:
        return self._pinned(("branch", branch), lambda: self._branch_exists(branch))

    def _branch_exists(self, branch: str) -> bool:
        try:
            return self._reader.references.get(f"refs/heads/{branch}") is not None
        except (ValueError, pygit2.GitError):
            return False

    def _pinned(self, key: tuple[str, ...], read: Callable[[], _T]) -> _T:
        if self._pins is None:
            return read()
        if key not in self._pins:
            self._pins[key] = read()
        return self._pins[key]  # type: ignore[no-any-return]

    def repo_settings(self, sha: str) -> RepoSettings:
        """gateway.yaml at `sha` (parsed once per content: kept by the file's blob id)."""
        blob = self._entry(self._commit(sha).tree, "gateway.yaml")
        if blob is None or blob.type != ObjectType.BLOB:
            raise NotFound(f"gateway.yaml does not exist at {sha[:12]}")
        return _SETTINGS.get(self._reader, str(blob.id), self.repository)  # type: ignore[no-any-return]

    def merge_base(self, a: str, b: str) -> str:
        base = self._reader.merge_base(self._commit(a).id, self._commit(b).id)
        if base is None:
            raise Conflict(f"{a} and {b} have no common history")
        return str(base)

    def changed_paths(self, base: str, head: str) -> list[str]:
        """Every path added, changed, removed or renamed between two commits (cached: commits never change)."""
        return list(_CHANGED_PATHS.get(self._reader, self.resolve(base), self.resolve(head)))

    def diff(self, base: str, head: str) -> str:
        """The text diff between two commits (cached: commits never change, and every page view shows it)."""
        return _DIFFS.get(self._reader, self.resolve(base), self.resolve(head))  # type: ignore[no-any-return]

    def commits(self, base: str, head: str) -> list[CommitInfo]:
        """The commits in `base..head`, oldest first."""
        walker = self._reader.walk(self._commit(head).id, SortMode.TOPOLOGICAL | SortMode.TIME | SortMode.REVERSE)
        walker.hide(self._commit(base).id)
        return [CommitInfo(str(c.id), c.author.name or "unknown", c.author.email or "", c.message) for c in walker]

    def read_file(self, sha: str, path: str) -> str:
        blob = self._entry(self._commit(sha).tree, path)
        if blob is None or blob.type != ObjectType.BLOB:
            raise NotFound(f"{path} does not exist at {sha[:12]}")
        return _text(blob)

    def read_files(self, sha: str, subdir: str, suffix: str) -> dict[str, str]:
        """The text of each file directly under `subdir` at `sha` whose name ends with `suffix` (symlinks skipped)."""
        tree = self._subtree(sha, subdir)
        if tree is None:
            return {}
        return {f"{subdir}/{entry.name}": _text(entry) for entry in tree
                if entry.type == ObjectType.BLOB and entry.filemode != FileMode.LINK and entry.name.endswith(suffix)}

    def read_tree(self, sha: str, subdir: str) -> dict[str, str]:
        """The text of every file under `subdir` at `sha`, recursively (symlinks and non-UTF-8 files skipped)."""
        tree = self._subtree(sha, subdir)
        if tree is None:
            return {}
        out = {}
        for path, entry in _walk(tree, subdir.strip("/")):
            if entry.type == ObjectType.BLOB and entry.filemode != FileMode.LINK:
                try:
                    out[path] = _text(entry)
                except UnicodeDecodeError:
                    continue
        return out

    def export(self, sha: str, subdir: str, dest: Path) -> Path:
        """Write the files under `subdir` at commit `sha` into `dest` (not recursing into subfolders' git links)."""
        tree = self._subtree(sha, subdir)
        if tree is None:
            raise NotFound(f"{subdir} does not exist at {sha[:12]}")
        dest.mkdir(parents=True, exist_ok=True)
        top = subdir.strip("/")
        for path, entry in _walk(tree, top):
            target = dest / Path(path).relative_to(top) if top else dest / path
            if entry.type == ObjectType.TREE:
                target.mkdir(parents=True, exist_ok=True)
            elif entry.type == ObjectType.BLOB:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(entry.data)
        return dest

    def module_directories(self, sha: str, stack_path: str) -> tuple[str, ...]:
        """The local module directories the stack at `stack_path` calls at `sha` (see adapters/modules/sources.py)."""
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
        old, new = self._commit(older).id, self._commit(newer).id
        return old == new or bool(self._reader.descendant_of(new, old))

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
        tree = self._subtree(sha, subdir)
        return None if tree is None else str(tree.id)

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

    def commit_to_new_branch(self, base_sha: str, branch: str, files: Mapping[str, str], message: str,
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
                mainline = ["-m", "1"] if len(self._commit(merge_sha).parents) > 1 else []  # squash: one parent
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

    def _commit(self, ref: str) -> pygit2.Commit:
        try:
            return self._reader.revparse_single(ref).peel(pygit2.Commit)
        except (KeyError, ValueError, pygit2.GitError):
            raise NotFound(f"unknown git ref {ref!r} in the declaration repo") from None

    @staticmethod
    def _entry(tree: pygit2.Tree, path: str) -> pygit2.Object | None:
        """The object at `path` under `tree` ('' or '.' is the tree itself), or None."""
        path = path.strip("/")
        if path in ("", "."):
            return tree
        try:
            return tree / path
        except (KeyError, ValueError, pygit2.GitError):
            return None

    def _subtree(self, sha: str, subdir: str) -> pygit2.Tree | None:
        found = self._entry(self._commit(sha).tree, subdir)
        return found if isinstance(found, pygit2.Tree) else None

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
            from git.exc import GitCommandError

            output = exc.__cause__.stdout if isinstance(exc.__cause__, GitCommandError) else ""
            raise Conflict(_conflict([line.split("\t", 1)[-1] for line in output.splitlines() if "\t" in line])) \
                from exc

    def merge_conflict(self, main_sha: str, head_sha: str) -> str | None:
        """Why `head_sha` does not merge cleanly into `main_sha`, in `merge_preview`'s words (None: it merges).

        Merged in memory by libgit2: a read may ask, since it writes nothing and starts no git process.
        """
        try:
            index = self._reader.merge_commits(self._commit(main_sha).id, self._commit(head_sha).id)
        except pygit2.GitError as exc:
            raise BackendError(f"merging {head_sha[:12]} into {main_sha[:12]} failed: {exc}") from exc
        if index.conflicts is None:
            return None
        return _conflict(sorted({entry.path for sides in index.conflicts for entry in sides if entry is not None}))

    def _git(self, *args: str, env: dict[str, str] | None = None) -> str:
        from git.exc import GitCommandError

        try:
            return str(self.repo.git.execute(["git", *args], env=env))
        except GitCommandError as exc:
            raise BackendError(f"git {args[0]} failed: {exc.stderr.strip() or exc}") from exc


def _conflict(paths: list[str]) -> str:
    """A merge that conflicts (in `paths`), for the person who can rebase."""
    where = f" (conflicts in {', '.join(sorted(set(paths)))})" if paths else ""
    return f"the branch does not merge cleanly into main{where}; rebase it on main and push again"


def _open(path: Path) -> pygit2.Repository:
    """The repo at exactly `path` (never one found in a parent directory, as GitPython's default is too)."""
    return pygit2.Repository(str(path), RepositoryOpenFlag.NO_SEARCH)


def _walk(tree: pygit2.Tree, prefix: str) -> Iterator[tuple[str, pygit2.Object]]:
    """Every entry under `tree`, depth first, with its path from the repo's root (trees before their entries)."""
    for entry in tree:
        path = f"{prefix}/{entry.name}" if prefix else str(entry.name)
        yield path, entry
        if isinstance(entry, pygit2.Tree):
            yield from _walk(entry, path)


def _text(blob: pygit2.Object) -> str:
    return bytes(blob.data).decode("utf-8")


class _ByObjectId:
    """What is at a commit never changes: values derived from object ids, kept by (repo path, ids), least recently
    used dropped first. A miss computes with the caller's handle; no handle is kept."""

    def __init__(self, size: int, derive: Callable[..., Any]):
        self._size, self._derive = size, derive
        self._values: OrderedDict[tuple[str, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, reader: pygit2.Repository, *ids: str) -> Any:
        key = (str(reader.path), *ids)
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = self._derive(reader, *ids)
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                self._values.popitem(last=False)
        return value


def _settings_of_blob(reader: pygit2.Repository, blob: str, repository: str) -> RepoSettings:
    return qualified(parse_repo_settings(_text(reader[blob])), repository)


def _changed_paths(reader: pygit2.Repository, base: str, head: str) -> tuple[str, ...]:
    deltas = reader.diff(base, head).deltas  # no rename detection: a rename is its old and its new path
    return tuple(sorted({path for d in deltas for path in (d.old_file.path, d.new_file.path)}))


def _diff(reader: pygit2.Repository, base: str, head: str) -> str:
    diff = reader.diff(base, head, flags=DiffOption.INDENT_HEURISTIC)  # hunks as `git diff` cuts them
    diff.find_similar()  # and renames shown as renames
    return str(diff.patch or "")


_SETTINGS = _ByObjectId(256, _settings_of_blob)  # gateway.yaml, parsed once per blob
_CHANGED_PATHS = _ByObjectId(1024, _changed_paths)
_DIFFS = _ByObjectId(128, _diff)


@functools.lru_cache(maxsize=4096)
def _cached_module_directories(path: str, sha: str, stack_path: str) -> tuple[str, ...]:
    from gateway.adapters.modules.sources import local_module_directories  # the HCL parser, only when asked

    repo = GitDeclarationRepo(Path(path))
    return local_module_directories(stack_path, lambda directory: repo.read_files(sha, directory, ".tf"))


def committer_env(name: str = "change-gateway", email: str = "gateway@localhost") -> dict[str, str]:
    """Git identity for commits the gateway makes; the machine may have none configured."""
    return {
        **os.environ,
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
