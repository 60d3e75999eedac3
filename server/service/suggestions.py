"""SuggestTrials: a client's ACTIVE trials first, then one designer run shared by the calls
that wait for it (module doc of ``server.service``)."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, cast

from server import limits
from server.storage import NewBatch, NewTrial, Request
from tuner.errors import AlreadyExistsError, OverloadedError, TakenError, ValidationError
from tuner.loop import new_trial
from tuner.study import StudySpec
from tuner.transfer import read_sources
from tuner.trial import Trial

if TYPE_CHECKING:
    from tuner.designer import Suggestion
from server.service.checks import MAX_CLIENT_ID, checked_text, request_record, study_name, trial_key
from server.service.core import ServiceCore
from server.service.queue import Ask, Queue, answer_of

log = logging.getLogger("server.service")

MAX_SUGGESTIONS = 100
#: Designer runs again after another writer stored a run's configurations first: each race
#: lost means another writer made progress, so a few settle even many replicas at once.
MAX_TAKEN_RETRIES = 8
#: Knob values one SuggestTrials call may create (count x knobs): every value is stored and
#: sent, so a call on a many-knob study asks for fewer trials at a time.
MAX_SUGGESTED_VALUES = 50_000


class Suggestions(ServiceCore):
    """``suggest_trials`` and the designer runs behind it."""

    def suggest_trials(
        self, study: str, count: int, client_id: str = "", request_id: str = ""
    ) -> list[Trial]:
        """Trials for ``client_id`` to run: its ACTIVE ones first, then new suggestions.

        A repeated call with the same ``request_id`` returns the trials the first one
        returned (as they are now) and creates nothing. Calls of one client on one study
        are answered one after the other (a second waits for the first, then gets what
        the first left it); new suggestions for calls of different clients come from one
        designer run (``_new_trials``).

        Raises:
            OverloadedError: ``max_waiting`` calls are already waiting for suggestions;
                nothing was done, and the error says when to try again.
        """
        arrived = self._clock()
        study = study_name(study)
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or not 1 <= count <= MAX_SUGGESTIONS
        ):
            raise ValidationError(
                "count", f"got {count!r}", f"an integer in [1, {MAX_SUGGESTIONS}]"
            )
        client_id = checked_text(client_id, "client_id", MAX_CLIENT_ID)
        request = request_record(request_id, "SuggestTrials", study, count, client_id)
        caller = (study, client_id or (f"request:{request_id}" if request_id else ""))
        with self._asking:
            if self.max_waiting and self._suggesting >= self.max_waiting:
                wait = self._designer.retry_after()
                raise OverloadedError(
                    f"{self._suggesting} SuggestTrials calls are already waiting for the "
                    f"designer (at most {self.max_waiting}); nothing was done: send the same "
                    f"request again in {wait:.1f} s",
                    wait,
                )
            self._suggesting += 1
            while caller[1] and caller in self._callers:  # the same caller's earlier call
                self._asking.wait()
            if caller[1]:
                self._callers.add(caller)
        try:
            with self._lock(study):
                knobs = len(self._spec(study).space)
                if count * knobs > MAX_SUGGESTED_VALUES:
                    raise ValidationError(
                        "count",
                        f"{count} trials of {knobs} knobs are {count * knobs} knob values, "
                        f"more than one call creates ({MAX_SUGGESTED_VALUES})",
                        f"at most {max(1, MAX_SUGGESTED_VALUES // knobs)} trials per call "
                        "for this study",
                    )
                limits.check_suggestion(self._spec(study), count, client_id)
                if request is not None and (known := self._replay(study, request)) is not None:
                    return known
                self._expire(study, arrived)
                lease = self._lease_end()
                mine = self.storage.active_trials(study, client_id) if client_id else []
                if lease is not None:  # asking again is a sign of life
                    mine = [self.storage.renew_lease(study, t.id, lease) for t in mine]
                if len(mine) < count:
                    mine += self.storage.claim_trials(study, client_id, count - len(mine), lease)
                if len(mine) >= count:
                    mine = mine[:count]
                    if request is not None:
                        try:
                            self.storage.add_trials(study, [], request, [t.id for t in mine])
                        except AlreadyExistsError:
                            return self._replayed(study, request)
                    return mine
            need = count - len(mine)
            limits.check_new_trials(self.storage, self._spec(study), need, client_id)
            ask = Ask(need, client_id, request, [t.id for t in mine])
            new = self._new_trials(study, ask)
            if ask.replayed is not None:
                return ask.replayed
        finally:
            with self._asking:
                self._suggesting -= 1
                self._callers.discard(caller)
                self._asking.notify_all()
        for trial in new:
            if trial.warning:
                log.warning("study %s trial %d: %s", study, trial.id, trial.warning,
                            extra={"study": study, "trial": trial.id})  # fmt: skip
        return mine + new

    def _new_trials(self, study: str, ask: Ask) -> list[Trial]:
        """New trials for ``ask``, from the study's next designer run.

        Calls that need new suggestions while a run for their study is in progress wait
        for it to end; then one of them leads the next run, for all of them at once (the
        designer sees every trial stored so far, the earlier runs' ones pending). So each
        study has at most one designer run at a time, and concurrent callers share it.
        """
        with self._asking:
            queue = self._queues.setdefault(study, Queue())
            queue.waiting.append(ask)
            if not queue.running:
                queue.running = ask.leads = True
            while not ask.leads and not ask.done:
                self._asking.wait()
            if ask.done:
                return answer_of(ask)
            batch, queue.waiting = queue.waiting, []
        try:
            self._run_batch(study, batch)
        finally:
            with self._asking:
                for each in batch:
                    each.done = True
                if queue.waiting:
                    queue.waiting[0].leads = True
                else:
                    queue.running = False
                    del self._queues[study]
                self._asking.notify_all()
        return answer_of(ask)

    def _run_batch(self, study: str, batch: list[Ask]) -> None:
        """One designer run for every call in ``batch``; each call's trials are stored with
        its own client, lease and request record, all in one transaction (so completions
        on the study wait for one write, not one per call).

        Another writer on the same database (a replica, a session on the same file) may
        have read the same trials and chosen the same configurations meanwhile: storage
        refuses those (``TakenError``, nothing stored), and the designer runs again with
        the other writer's trials in view and a salt of its own, so that its next draws
        are not the other writer's next draws too (``History.salt``). After
        ``MAX_TAKEN_RETRIES`` such races the calls are refused as overloaded."""
        try:
            spec = self._spec(study)
            need = sum(ask.need for ask in batch)
            salt = 0
            # read once per designer run (the designer caches their fitted models)
            sources, problems = read_sources(spec, self._source)
            for attempt in range(MAX_TAKEN_RETRIES + 1):
                trials = self.storage.list_trials(study)  # a snapshot: no lock needed
                since = trials[-1].id if trials else 0
                suggestions = self._designer.propose(
                    spec, trials, need, self.fit_cache, salt, sources
                )
                try:
                    self._store_batch(study, spec, batch, suggestions, since, problems.warning())
                    return
                except TakenError as taken:
                    log.info("study %s: suggesting again (%d): %s", study, attempt + 1, taken,
                             extra={"study": study})  # fmt: skip
                    salt = secrets.randbits(31) | 1
            wait = self._designer.retry_after()
            raise OverloadedError(
                f"study {study!r}: other writers stored the configurations suggested for "
                f"this call first, {MAX_TAKEN_RETRIES + 1} times in a row; nothing was "
                f"stored: send the same request again in {wait:.1f} s",
                wait,
            )
        except Exception as error:  # every call of the batch gets it, not only the leader
            for ask in batch:
                ask.error = error

    def _store_batch(
        self,
        study: str,
        spec: StudySpec,
        batch: list[Ask],
        suggestions: list[Suggestion],
        since: int,
        warning: str = "",
    ) -> None:
        """Store ``batch``'s share of ``suggestions`` (chosen from the trials up to trial
        ``since``) for each of its calls, or raise ``TakenError`` storing nothing.
        ``warning``: on every trial, after the suggestion's own (a missing transfer source)."""
        with self._lock(study):
            lease = self._lease_end()
            batches = []
            for ask in batch:
                part, suggestions = suggestions[: ask.need], suggestions[ask.need :]
                # storage numbers them
                made = [new_trial(0, s, ask.client_id, warning) for s in part]
                new = [
                    NewTrial(t.config, t.client_id, t.source, t.warning, embedded=t.embedded,
                             lease_expires_at=lease, step=t.step, key=trial_key(spec, t.config),
                             transfer=t.transfer)
                    for t in made
                ]  # fmt: skip
                batches.append(NewBatch(new, ask.request, ask.mine))
            added = self.storage.add_trial_batches(study, batches, since)
            for ask, trials_added in zip(batch, added, strict=True):
                if trials_added is None:
                    # retried on another server, which answered first: that answer
                    # stands (nothing of this one was stored); the batch goes on
                    ask.replayed = self._replayed(study, cast(Request, ask.request))
                else:
                    ask.trials = trials_added
