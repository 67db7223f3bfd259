"""Filing fingerprints in the database: the state every consumer process groups by.

What is decided once is stored: a Fingerprint row says which pattern a fingerprint's dead letters go to, so
the common case (a fingerprint seen before) costs one indexed read per batch for all its letters. Only a new
fingerprint of a text cluster costs more: the consumer locks the cluster row, reads the cluster's fingerprints,
mines them together with the new ones (`mining.generalize_all`, a pure function of the set) and stores the result.
A cluster is one error type, one failure reason and one first word, whatever the token count, so the merges across
token counts are decided under the same lock as the others.
Because the lock serialises the deciders and each one decides from the whole committed set, the patterns end
up the same however many consumers there are and in whatever order the messages came; a pattern whose
template generalises is absorbed into the new one (merged_into), so it records what it absorbed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import F

from dlqconsole.deadletters.fingerprint import Fingerprint as Found
from dlqconsole.deadletters.grouping.engine import Pattern, cluster_of, is_trace_cluster, patterns_of_cluster, scope_of
from dlqconsole.deadletters.grouping.vocabulary import is_wildcard
from dlqconsole.deadletters.masking import WILDCARD
from dlqconsole.deadletters.models import (
    FailurePattern,
    Fingerprint,
    FingerprintKind,
    PatternCluster,
    PatternEvent,
    PatternOrigin,
)
from dlqconsole.deadletters.services import absorb_pattern, lock_fingerprints, move_dead_letters

CHUNK = 500
MAX_HOPS = 8
# Fingerprint keys this process has read, so that a batch asks the database which fingerprints exist only for the
# others. Grouping never deletes a fingerprint row; its pattern changes (merges, regrouping) under the share lock
# read_filing takes, which is why only the keys are kept here, not their patterns. A key whose row is missing after
# all (read in a transaction that was rolled back) is filed again. Past MAX_KNOWN keys the set starts again empty.
_known: set[str] = set()
MAX_KNOWN = 200_000
# From this many fingerprints on, a cluster is not mined again for newcomers that fit one of its templates.
LARGE_CLUSTER = 100


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fingerprint met in a batch, with what its first dead letter says about the failure."""

    found: Found
    reason: str
    transient: bool


@dataclass(frozen=True, slots=True)
class Member:
    tokens: tuple[str, ...]
    pattern_id: int
    auto_pattern_id: int | None


def file_fingerprints(
    *, candidates: dict[str, Candidate], now: dt.datetime, extra_keys: Iterable[str] = ()
) -> dict[str, int]:
    """{fingerprint key: pattern id} for the candidates (and for `extra_keys`, fingerprints that already
    exist, such as rules'), creating what is missing. Holds a share lock on those fingerprint rows until the
    transaction ends, so a merge or split of their patterns waits for this batch to commit."""
    keys = sorted(set(candidates) | set(extra_keys))
    file_new_fingerprints(candidates={key: value for key, value in candidates.items() if key not in _known}, now=now)
    filing = read_filing(keys)
    missing = {key: value for key, value in candidates.items() if key not in filing}
    if missing:
        # A row this process read in a transaction that was rolled back since (its own filing), or one deleted
        # by hand: file it again.
        _known.difference_update(missing)
        # Filing them may regroup the others: read them all again.
        file_new_fingerprints(candidates=missing, now=now)
        filing = read_filing(keys)
    return filing


def file_new_fingerprints(*, candidates: dict[str, Candidate], now: dt.datetime) -> None:
    """Create the fingerprints among `candidates` that are not filed yet, and the patterns they make. Cluster rows
    stay locked until the transaction ends: a caller that has more to do in its transaction files in a short one
    of its own first (ingest does), so that concurrent batches wait for each other's mining only."""
    known = _existing(sorted(candidates))
    new = [candidates[key] for key in sorted(candidates) if key not in known]
    if new:
        clusters: dict[tuple[str, str, str], list[Candidate]] = defaultdict(list)
        singles: list[Candidate] = []
        for candidate in new:
            cluster = cluster_of(candidate.found, candidate.reason)
            if cluster is None:
                singles.append(candidate)
            else:
                clusters[cluster].append(candidate)
        if clusters:
            _file_clusters(clusters, now=now)
        if singles:
            _file_singles(singles, now=now)


def is_known(key: str) -> bool:
    """This process has read or filed the fingerprint `key` (a committed or uncommitted row of its own)."""
    return key in _known


def _remember(keys: Iterable[str]) -> None:
    if len(_known) > MAX_KNOWN:
        _known.clear()
    _known.update(keys)


def read_filing(keys: Iterable[str]) -> dict[str, int]:
    """{fingerprint key: pattern id}, share-locking the rows (PostgreSQL; SQLite has a single writer)."""
    ordered = sorted(set(keys))
    table = Fingerprint._meta.db_table
    lock = " FOR KEY SHARE" if connection.vendor == "postgresql" else ""
    filing: dict[str, int] = {}
    with connection.cursor() as cursor:
        for start in range(0, len(ordered), CHUNK):
            condition, params = _key_in(ordered[start : start + CHUNK])
            cursor.execute(f"SELECT key, pattern_id FROM {table} WHERE {condition} ORDER BY key{lock}", params)
            filing.update((str(key), int(pattern_id)) for key, pattern_id in cursor.fetchall())
    _remember(filing)
    # Every merge repoints the fingerprints of the pattern it merges away, under the lock this read waits
    # for, so the patterns read here are surviving ones: no merge chain to follow.
    return filing


def _existing(keys: list[str]) -> set[str]:
    table = Fingerprint._meta.db_table
    found: set[str] = set()
    with connection.cursor() as cursor:
        for start in range(0, len(keys), CHUNK):
            condition, params = _key_in(keys[start : start + CHUNK])
            cursor.execute(f"SELECT key FROM {table} WHERE {condition}", params)
            found.update(str(row[0]) for row in cursor.fetchall())
    return found


def _key_in(keys: list[str]) -> tuple[str, list[Any]]:
    # One text parameter on PostgreSQL: hundreds of placeholders, or an array of hundreds of strings, cost the
    # client more to prepare than the query costs the server. Keys are hex digests or "rule-<id>": no commas.
    if connection.vendor == "postgresql":
        return "key = ANY(string_to_array(%s, ','))", [",".join(keys)]
    return f"key IN ({','.join(['%s'] * len(keys))})", list(keys)


def resolve(pattern_ids: Iterable[int]) -> dict[int, int]:
    """{pattern id: the pattern it ends in after following merges}."""
    result = {pattern_id: pattern_id for pattern_id in pattern_ids}
    pending = set(result)
    for _ in range(MAX_HOPS):
        if not pending:
            break
        hops = dict(
            FailurePattern.objects.filter(pk__in=pending, merged_into__isnull=False).values_list("pk", "merged_into_id")
        )
        if not hops:
            break
        for pattern_id, current in result.items():
            if current in hops:
                result[pattern_id] = hops[current]
        pending = set(hops.values())
    return result


def cluster_key(error_type: str, reason: str, anchor: str) -> str:
    # "word" sets these keys apart from those of clusters keyed by token count, which grouping no longer adds to.
    return hashlib.sha1(f"{error_type}\x00{reason}\x00word\x00{anchor}".encode(), usedforsecurity=False).hexdigest()


def _lock_clusters(clusters: Iterable[tuple[str, str, str]], *, now: dt.datetime) -> dict[tuple[str, str, str], int]:
    """Create the cluster rows that are missing and lock them all, in key order (so two consumers that need
    the same clusters cannot deadlock). Returns {cluster: id}."""
    by_key = {cluster_key(*cluster): cluster for cluster in clusters}
    PatternCluster.objects.bulk_create(
        [
            PatternCluster(
                key=key, error_type=error_type[:255], failure_reason=reason, anchor=anchor[:255], created_at=now
            )
            for key, (error_type, reason, anchor) in sorted(by_key.items())
        ],
        ignore_conflicts=True,
    )
    locked = PatternCluster.objects.select_for_update().filter(key__in=sorted(by_key)).order_by("key")
    return {by_key[key]: pk for key, pk in locked.values_list("key", "pk")}


def _insert_patterns(
    rows: Sequence[tuple[str, str, str, str, bool, str, tuple[str, ...]]], *, now: dt.datetime
) -> tuple[dict[str, int], set[int]]:
    """Create the patterns (key, template, error type, reason, transient, origin, tokens) that do not exist;
    returns ({key: id} for all of them, ids of those created now)."""
    table = FailurePattern._meta.db_table
    tokens_field = FailurePattern._meta.get_field("tokens")
    created: set[int] = set()
    with connection.cursor() as cursor:
        for start in range(0, len(rows), CHUNK):
            part = rows[start : start + CHUNK]
            values: list[Any] = []
            for key, template, error_type, reason, transient, origin, tokens in part:
                values += [key, template[:10000], error_type[:255], reason, transient, now, now, "open", now, "", now]
                values += [origin, tokens_field.get_db_prep_save(list(tokens), connection)]
            cursor.execute(
                f"INSERT INTO {table} (key, template, error_type, failure_reason, transient, total_count, "
                "first_seen_at, last_seen_at, status, status_changed_at, note, created_at, origin, tokens) VALUES "
                + ",".join(["(%s,%s,%s,%s,%s,0,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(part))
                + " ON CONFLICT (key) DO NOTHING RETURNING id",
                values,
            )
            created.update(int(row[0]) for row in cursor.fetchall())
    ids = dict(FailurePattern.objects.filter(key__in=[row[0] for row in rows]).values_list("key", "pk"))
    if created:
        PatternEvent.objects.bulk_create(
            PatternEvent(pattern_id=pattern_id, kind=PatternEvent.Kind.CREATED, created_at=now)
            for pattern_id in sorted(created)
        )
    return ids, created


def _file_singles(candidates: list[Candidate], *, now: dt.datetime) -> None:
    """Fingerprints that are never merged automatically (no error text): one pattern each."""
    rows = [
        (
            candidate.found.key,
            candidate.found.template,
            candidate.found.error_type,
            candidate.reason,
            candidate.transient,
            PatternOrigin.TEXT,
            (),
        )
        for candidate in candidates
    ]
    ids, _ = _insert_patterns(rows, now=now)
    final = resolve(ids.values())
    Fingerprint.objects.bulk_create(
        [
            Fingerprint(
                key=candidate.found.key,
                kind=FingerprintKind.EMPTY,
                template=candidate.found.template,
                error_type=candidate.found.error_type[:255],
                pattern_id=final[ids[candidate.found.key]],
                auto_pattern_id=ids[candidate.found.key],
                created_at=now,
            )
            for candidate in candidates
        ],
        ignore_conflicts=True,
    )


def _file_clusters(clusters: dict[tuple[str, str, str], list[Candidate]], *, now: dt.datetime) -> None:
    """New text fingerprints: lock their clusters, mine each with everything already in it, store the groups.
    A constant number of queries for the whole batch, whatever the number of clusters."""
    cluster_ids = _lock_clusters(clusters, now=now)
    sizes = dict(PatternCluster.objects.filter(pk__in=cluster_ids.values()).values_list("pk", "size"))
    quick = _quick_filing(
        {
            cluster: candidates
            for cluster, candidates in clusters.items()
            if sizes[cluster_ids[cluster]] >= LARGE_CLUSTER
        },
        cluster_ids,
    )
    full = {cluster: candidates for cluster, candidates in clusters.items() if cluster not in quick}
    existing: dict[int, dict[str, Member]] = defaultdict(dict)
    rows = Fingerprint.objects.filter(cluster_id__in=sorted(cluster_ids[cluster] for cluster in full)).values_list(
        "cluster_id", "key", "tokens", "pattern_id", "auto_pattern_id"
    )
    for cluster_id, key, tokens, pattern_id, auto_pattern_id in rows:
        existing[cluster_id][key] = Member(tuple(tokens), pattern_id, auto_pattern_id)
    mined: list[tuple[int, str, dict[str, Candidate], dict[str, Member], dict[str, Pattern]]] = []
    pattern_rows: dict[str, tuple[str, str, str, str, bool, str, tuple[str, ...]]] = {}
    for cluster, candidates in sorted(full.items()):
        error_type, reason, _ = cluster
        cluster_id = cluster_ids[cluster]
        members = existing[cluster_id]
        fresh = {candidate.found.key: candidate for candidate in candidates if candidate.found.key not in members}
        if not fresh:
            # Another consumer filed them while this one waited for the lock.
            continue
        tokens = {key: member.tokens for key, member in members.items()}
        tokens.update({key: candidate.found.tokens for key, candidate in fresh.items()})
        groups = patterns_of_cluster(error_type, tokens, scope_of(cluster))
        transient = next(iter(fresh.values())).transient
        for group in groups.values():
            if is_trace_cluster(cluster):
                origin = PatternOrigin.TRACE
            else:
                origin = PatternOrigin.MINED if WILDCARD in group.template else PatternOrigin.TEXT
            pattern_rows.setdefault(
                group.key, (group.key, group.template, error_type, reason, transient, origin, group.tokens)
            )
        mined.append((cluster_id, error_type, fresh, members, groups))
    ids: dict[str, int] = {}
    created: set[int] = set()
    if pattern_rows:
        ids, created = _insert_patterns([pattern_rows[key] for key in sorted(pattern_rows)], now=now)
    plans: list[tuple[int, str, dict[str, Candidate], dict[str, int]]] = []
    for cluster_id, error_type, fresh, members, groups in mined:
        changes = {
            key: ids[groups[key].key]
            for key, member in members.items()
            if ids[groups[key].key] != member.auto_pattern_id
        }
        if changes:
            _regroup(existing=members, changes=changes, created=created, now=now)
        plans.append((cluster_id, error_type, fresh, {key: ids[groups[key].key] for key in fresh}))
    for cluster, (fresh, autos) in sorted(quick.items()):
        plans.append((cluster_ids[cluster], cluster[0], fresh, autos))
    plans = [plan for plan in plans if plan[2]]
    if not plans:
        return
    final = resolve({auto for _, _, _, autos in plans for auto in autos.values()})
    Fingerprint.objects.bulk_create(
        [
            Fingerprint(
                key=key,
                kind=FingerprintKind.TRACE if candidate.found.kind == "trace" else FingerprintKind.TEXT,
                template=candidate.found.template,
                error_type=error_type[:255],
                tokens=list(candidate.found.tokens),
                cluster_id=cluster_id,
                pattern_id=final[autos[key]],
                auto_pattern_id=autos[key],
                created_at=now,
            )
            for cluster_id, error_type, fresh, autos in plans
            for key, candidate in sorted(fresh.items())
        ],
        ignore_conflicts=True,
    )
    # Under the cluster locks nobody else adds fingerprints to these clusters, so the new ones are all ours.
    for cluster_id, _, fresh, _ in plans:
        PatternCluster.objects.filter(pk=cluster_id).update(size=F("size") + len(fresh))


def _quick_filing(
    clusters: dict[tuple[str, str, str], list[Candidate]], cluster_ids: dict[tuple[str, str, str], int]
) -> dict[tuple[str, str, str], tuple[dict[str, Candidate], dict[str, int]]]:
    """For large clusters: when every new fingerprint fits a generalised template the cluster already has, file
    it there without mining the whole cluster again ({cluster: (fresh candidates, {key: group pattern id})}).

    Mining the whole cluster would put such a fingerprint in that group too (it matches the group's fixed words,
    so it is absorbed), unless it also made new merges possible elsewhere; the next full mining of the cluster
    (when a fingerprint that fits no group arrives) applies those. A cluster with any misfit is mined in full.
    """
    if not clusters:
        return {}
    ids = {cluster_ids[cluster] for cluster in clusters}
    keys = sorted({candidate.found.key for candidates in clusters.values() for candidate in candidates})
    present = set(Fingerprint.objects.filter(cluster_id__in=ids, key__in=keys).values_list("key", flat=True))
    pairs = set(Fingerprint.objects.filter(cluster_id__in=ids).values_list("cluster_id", "auto_pattern_id").distinct())
    group_tokens = dict(
        FailurePattern.objects.filter(pk__in={pattern_id for _, pattern_id in pairs if pattern_id is not None})
        .exclude(tokens=[])
        .values_list("pk", "tokens")
    )
    groups: dict[int, list[tuple[tuple[str, ...], int]]] = defaultdict(list)
    for cluster_id, pattern_id in pairs:
        tokens = tuple(group_tokens.get(pattern_id) or ())
        if tokens and any(is_wildcard(token) for token in tokens):
            groups[cluster_id].append((tokens, pattern_id))
    result: dict[tuple[str, str, str], tuple[dict[str, Candidate], dict[str, int]]] = {}
    for cluster, candidates in clusters.items():
        # Most wildcards first, then by template: the same choice in every process.
        choices = sorted(groups[cluster_ids[cluster]], key=lambda item: (-sum(map(is_wildcard, item[0])), item[0]))
        fresh = {candidate.found.key: candidate for candidate in candidates if candidate.found.key not in present}
        autos: dict[str, int] = {}
        for key, candidate in fresh.items():
            found = next((pattern_id for tokens, pattern_id in choices if _fits(candidate.found.tokens, tokens)), None)
            if found is None:
                break
            autos[key] = found
        else:
            result[cluster] = (fresh, autos)
    return result


def _fits(tokens: tuple[str, ...], template: tuple[str, ...]) -> bool:
    return len(tokens) == len(template) and all(
        mine == theirs or is_wildcard(theirs) for mine, theirs in zip(tokens, template, strict=True)
    )


def _regroup(*, existing: dict[str, Member], changes: dict[str, int], created: set[int], now: dt.datetime) -> None:
    """Existing fingerprints whose group changed (their template generalised): repoint them, and move their
    dead letters. A pattern left without fingerprints is absorbed into the one that took them."""
    # An operator's merge sticks: when a group an operator had merged away generalises into a new pattern,
    # the new pattern follows it into the same place.
    follow: dict[int, set[int]] = defaultdict(set)
    for key, new_auto in changes.items():
        member = existing[key]
        if new_auto in created and member.auto_pattern_id is not None and member.pattern_id != member.auto_pattern_id:
            follow[new_auto].add(member.pattern_id)
    for new_auto, merged_to in sorted(follow.items()):
        follow_id = min(merged_to)
        FailurePattern.objects.filter(pk=new_auto).update(merged_into_id=follow_id, merged_at=now)
        PatternEvent.objects.create(
            pattern_id=new_auto,
            kind=PatternEvent.Kind.MERGED,
            detail=f"Merged into #{follow_id}, where an operator had merged the patterns it generalises",
            created_at=now,
        )
    finals = resolve(set(changes.values()))
    touched = {existing[key].pattern_id for key in changes} | set(finals.values())
    lock_fingerprints(pattern_ids=touched)
    patterns = {
        pattern.pk: pattern
        for pattern in FailurePattern.objects.select_for_update().filter(pk__in=touched).order_by("pk")
    }

    repoint: dict[tuple[int, int], list[str]] = defaultdict(list)
    moves: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key, new_auto in sorted(changes.items()):
        repoint[(new_auto, finals[new_auto])].append(key)
        if existing[key].pattern_id != finals[new_auto]:
            moves[existing[key].pattern_id][finals[new_auto]].append(key)
    for (new_auto, final), keys in sorted(repoint.items()):
        Fingerprint.objects.filter(key__in=keys).update(auto_pattern_id=new_auto, pattern_id=final)

    inherited: set[int] = set()
    # The busiest old pattern first: a new pattern takes over its triage (status, owner, note).
    for source_id in sorted(moves, key=lambda pk: (-patterns[pk].total_count, pk)):
        targets = moves[source_id]
        source = patterns[source_id]
        emptied = not Fingerprint.objects.filter(pattern_id=source_id).exists()
        if len(targets) == 1 and emptied and source.merged_into_id is None:
            ((target_id, _),) = targets.items()
            target = patterns[target_id]
            absorb_pattern(
                source=source,
                target=target,
                actor=None,
                now=now,
                detail=f"its template generalised to {target.template[:300]}",
                inherit_triage=target_id in created and target_id not in inherited,
            )
            inherited.add(target_id)
            continue
        for target_id, keys in sorted(targets.items()):
            moved, _, _ = move_dead_letters(source_id=source_id, target_id=target_id, fingerprints=keys)
            target = patterns[target_id]
            target.total_count += moved
            target.save(update_fields=["total_count"])
            source.total_count = max(0, source.total_count - moved)
            source.save(update_fields=["total_count"])
            PatternEvent.objects.bulk_create(
                [
                    PatternEvent(
                        pattern_id=source_id,
                        kind=PatternEvent.Kind.SPLIT,
                        detail=f"{moved} dead letters regrouped into #{target_id} automatically",
                        created_at=now,
                    ),
                    PatternEvent(
                        pattern_id=target_id,
                        kind=PatternEvent.Kind.MERGED,
                        detail=f"Took {moved} dead letters from #{source_id} automatically",
                        created_at=now,
                    ),
                ]
            )
