"""The code host's git remote, as both forges use it: its main fetched as the truth, a branch brought together with
the gateway's copy, pushes never forced, and git's errors mapped once (the far side or the network: Unavailable,
since the same command later may work; anything else: BackendError). Git authenticates with an HTTP header passed in
the environment (`_git_auth_env`), so no token lands in a command line, a remote or a log."""

from __future__ import annotations

import os
import re
from pathlib import Path

import git

from gateway.domain.errors import BackendError, Unavailable

# git's words when the far side or the network failed, not the request (then the same command later may work)
GIT_TRANSIENT = re.compile(r"returned error: (5\d\d|429)|could not resolve host|failed to connect|connection "
                           r"(timed out|reset|refused)|operation timed out|early eof|rpc failed|remote end hung up",
                           re.IGNORECASE)


class GitRemote:
    """Mixed into a forge adapter: `host` names the code host in errors and in the gateway's remote-tracking refs."""

    host: str
    local_repo: Path

    def clone_url(self) -> str:
        """The repository's address for git (each forge's settings say it)."""
        raise NotImplementedError

    def fetch_main(self, main: str) -> None:
        """Make the gateway's main exactly the code host's (with a forge, the code host's main is the truth)."""
        self._git("fetch", "--quiet", "--update-head-ok", "--no-tags", self.clone_url(),
                  f"+refs/heads/{main}:refs/heads/{main}")

    def sync_branch(self, branch: str) -> str:
        """Bring a pull (merge) request's branch and the gateway's copy together; returns the head both now have.

        The code host ahead: take it. The gateway ahead (the agent's commits not yet pushed): push them. Diverged (a
        force-push on the code host): the code host's wins, the pull request is what people review.
        """
        remote = f"refs/remotes/{self.host.lower()}/{branch}"
        self._git("fetch", "--quiet", "--no-tags", self.clone_url(), f"+refs/heads/{branch}:{remote}")
        repo = git.Repo(self.local_repo)
        theirs = repo.commit(remote).hexsha
        local = f"refs/heads/{branch}"
        ours = repo.commit(local).hexsha if branch in {h.name for h in repo.branches} else None
        if ours is not None and ours != theirs and repo.is_ancestor(theirs, ours):
            self.push(branch, ours)
            return ours
        repo.git.update_ref(local, theirs)
        return theirs

    def push(self, branch: str, sha: str) -> None:
        """Publish a branch the gateway made (never forced: a branch someone else moved is not overwritten)."""
        self._git("push", "--quiet", self.clone_url(), f"{sha}:refs/heads/{branch}")

    def clone_main(self, into: Path) -> None:
        """A clone of the code host's default branch as it is now (its history too), in the new folder `into`."""
        self._git("clone", "--quiet", "--single-branch", "--no-tags", self.clone_url(), str(into))

    def _git(self, *args: str) -> None:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", **self._git_auth_env()}
        try:
            git.Repo(self.local_repo).git.execute(["git", *args], env=env)
        except git.GitCommandError as exc:
            why = str(exc.stderr).strip() or str(exc.status)
            if GIT_TRANSIENT.search(why):
                raise Unavailable(f"{self.host} is unavailable (git {args[0]}): {why}") from exc
            raise BackendError(f"git {args[0]} with {self.host} failed: {why}") from exc

    def _git_auth_env(self) -> dict[str, str]:
        return {}
