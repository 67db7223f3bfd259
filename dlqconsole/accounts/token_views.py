"""The user's own API tokens: make one (shown once, on the answer to the form, never again), see when each was last
used, revoke one. Everyone signed in may hold tokens; a token acts with its user's role at each request, so a
viewer's tokens read and change nothing.

The answer to a create is never cached, and a browser that reloads it sends the form again: the page then says the
token was made already (it is not shown a second time, nor kept anywhere to show it again) rather than refusing its
name as taken."""

from __future__ import annotations

import datetime as dt
import re

from django.contrib import messages
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_variables
from django.views.decorators.http import require_http_methods

from dlqconsole.accounts.models import ApiToken
from dlqconsole.accounts.tokens import NAME_RULE, TokenError, create_token, describe, revoke_tokens

# The expiry choices of the form, in days; "" never expires.
LIFETIMES = [("30", "30 days"), ("90", "90 days"), ("365", "1 year"), ("", "Never")]
SENT_AGAIN = "This token was created already; it is shown only once. Revoke it and create another if you lost it."


def sent_again(user: User, name: str, shown: str) -> bool:
    """Whether a create is a form sent a second time (its answer reloaded, or Back then Forward): the user has a live
    token of this name made since the form was drawn. `shown` is the form's hidden field, when it was drawn in
    seconds since the epoch; it only chooses what the page says, as the name is refused either way."""
    if not re.fullmatch(r"[0-9]{1,11}", shown):
        return False
    drawn = dt.datetime.fromtimestamp(int(shown), tz=dt.UTC)
    return ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True, created_at__gte=drawn).exists()


@never_cache
@require_http_methods(["GET", "POST"])
@sensitive_variables("created")  # the new token, shown once: Django's error reports hide it
def token_list(request: HttpRequest) -> HttpResponse:
    user = request.user
    assert isinstance(user, User)  # LoginRequiredMiddleware lets no one else in
    created = ""
    problem = ""
    notice = ""
    typed = {"name": "", "lifetime": "90", "read_only": ""}
    if request.method == "POST" and request.POST.get("action") == "revoke":
        # The form sends a token's id; anything else (a form posted by hand) names no token of theirs.
        pk = request.POST.get("token", "")
        if not re.fullmatch(r"[0-9]{1,18}", pk):
            raise Http404("No such token.")
        token = get_object_or_404(ApiToken.objects.select_related("user"), pk=int(pk), user=user)
        if revoke_tokens([token], actor=user):
            messages.success(request, f"Revoked {describe(token)}. Requests with it now get 401.")
        return redirect("accounts:tokens")
    if request.method == "POST":
        typed = {
            "name": request.POST.get("name", "").strip(),
            "lifetime": request.POST.get("lifetime", ""),
            "read_only": "on" if request.POST.get("read_only") else "",
        }
        try:
            if typed["lifetime"] not in {value for value, _ in LIFETIMES}:
                raise TokenError("Choose one of the expiry choices.")
            days = int(typed["lifetime"]) if typed["lifetime"] else None
            expires_at = timezone.now() + dt.timedelta(days=days) if days else None
            _, created = create_token(
                user=user, name=typed["name"], expires_at=expires_at, read_only=bool(typed["read_only"]), actor=user
            )
            typed = {"name": "", "lifetime": "90", "read_only": ""}
        except (TokenError, ValueError) as error:
            if sent_again(user, typed["name"], request.POST.get("shown", "")):
                notice = SENT_AGAIN
                typed = {"name": "", "lifetime": "90", "read_only": ""}
            else:
                problem = str(error)
    now = timezone.now()
    tokens = [(token, token.state(now)) for token in ApiToken.objects.filter(user=user)[:200]]
    context = {
        "tokens": tokens,
        "created": created,
        "problem": problem,
        "notice": notice,
        "typed": typed,
        "shown": int(now.timestamp()),
        "lifetimes": LIFETIMES,
        "name_rule": NAME_RULE,
    }
    return render(request, "accounts/tokens.html", context, status=400 if problem else 200)
