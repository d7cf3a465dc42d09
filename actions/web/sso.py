"""Single sign-on with the company's identity provider: OpenID Connect's authorization code flow
with PKCE, by mozilla-django-oidc, configured from the issuer alone (its discovery document
names the endpoints and the keys).

What mozilla-django-oidc leaves to the site, done here:

- **The ID token is checked whole**: its signature (the provider's keys, RS256 unless
  GRUNDLAG_OIDC_SIGN_ALGO says otherwise), issuer, audience (this site's client id), expiry,
  time of issue and nonce. (The library checks the signature and the nonce only.)
- **A person is found by who they are at the provider** (issuer and subject: SignInIdentity),
  never by an email address; they are made a user at their first sign-in.
- **Their teams and roles follow their groups** (the GRUNDLAG_OIDC_GROUPS_CLAIM claim, mapped by
  SignInGroup rows in the admin) at every sign-in; where groups are mapped, someone they put in
  no team (and no team's admin did) is refused, staff excepted. Without any mapping, people sign
  in and teams' admins add them on the Team page.
- **A refusal says why** on the sign-in page, and is not counted as a password guess.
- **Logout** ends the session here, then at the provider when it supports RP-initiated logout
  (its discovery names an ``end_session_endpoint``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.contrib.auth.views import LoginView
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views import View
from django.views.decorators.http import require_POST
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from actions import engine
from actions.models import DirectoryResource, Membership, SignInIdentity
from actions.web.auth import LoginForm, client_ip

logger = logging.getLogger(__name__)

# How long a discovery document is kept before it is read again (the provider's keys rotate).
DISCOVERY_SECONDS = 3600
# The provider's clock and ours may differ by this much.
LEEWAY_SECONDS = 60
_discovered: dict[str, Any] = {}
_discovery_lock = threading.Lock()


class ProviderUnavailable(Exception):
    """The identity provider's discovery document could not be read, or is not the issuer's."""


def enabled() -> bool:
    return bool(settings.GRUNDLAG_OIDC_ISSUER)


def provider() -> dict[str, Any]:
    """The issuer's discovery document (``/.well-known/openid-configuration``), read once an
    hour at most."""
    issuer = settings.GRUNDLAG_OIDC_ISSUER
    with _discovery_lock:
        known = _discovered.get(issuer)
        if known is not None and time.monotonic() - known["at"] < DISCOVERY_SECONDS:
            return dict(known["document"])
        url = f"{issuer}/.well-known/openid-configuration"
        try:
            response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            document = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise ProviderUnavailable(f"the identity provider's discovery document ({url}): {exc}") from exc
        # OpenID Connect Discovery, 4.3: the document is the issuer's own, or not to be used.
        if not isinstance(document, dict) or document.get("issuer") != issuer:
            found = document.get("issuer") if isinstance(document, dict) else None
            raise ProviderUnavailable(f"{url} names the issuer {found!r}, not {issuer!r}")
        for endpoint in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(endpoint), str):
                raise ProviderUnavailable(f"{url} names no {endpoint}")
        _discovered[issuer] = {"at": time.monotonic(), "document": document}
        return dict(document)


# mozilla-django-oidc reads its endpoints from settings: these are the discovered ones.
_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


def _setting(attr: str, *default: Any) -> Any:
    if attr in _ENDPOINTS:
        return provider().get(_ENDPOINTS[attr], *default)
    return import_from_settings(attr, *default)


class Refused(PermissionDenied):
    """A sign-in refused, with what the person is told."""


def _refuse(request: HttpRequest | None, why: str) -> Refused:
    if request is not None:
        request.grundlag_sign_in_refused = why  # type: ignore[attr-defined]
    logger.warning("sign-in refused: %s", why)
    return Refused(why)


class SignInBackend(OIDCAuthenticationBackend):
    """The provider's sign-in: acts only on the callback's request (it alone passes a nonce);
    a password login is the other backends' business."""

    # Read when used, not as the backend is made: Django makes its backends for every request
    # whose session names one (and the discovery document is a request to the provider).
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.UserModel = get_user_model()

    OIDC_RP_IDP_SIGN_KEY = None

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:  # noqa: N802 - the library's name
        return str(provider()["token_endpoint"])

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str | None:  # noqa: N802
        return provider().get("userinfo_endpoint")

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:  # noqa: N802
        return str(provider()["jwks_uri"])

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:  # noqa: N802
        return str(settings.OIDC_RP_CLIENT_ID)

    @property
    def OIDC_RP_CLIENT_SECRET(self) -> str:  # noqa: N802
        return str(settings.OIDC_RP_CLIENT_SECRET)

    @property
    def OIDC_RP_SIGN_ALGO(self) -> str:  # noqa: N802
        return str(settings.OIDC_RP_SIGN_ALGO)

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        return _setting(attr, *args)

    def get_user(self, user_id: Any) -> Any:
        """The session's user, unless their account was disabled meanwhile (the library's own
        would keep them signed in): their session ends with their next request."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or "nonce" not in kwargs or not enabled():
            return None
        request.grundlag_sign_in = True  # type: ignore[attr-defined]  # not a password guess
        try:
            return super().authenticate(request, **kwargs)
        except Refused:
            raise
        except requests.RequestException as exc:
            raise _refuse(
                request, f"the identity provider could not be reached ({type(exc).__name__})"
            ) from exc

    def get_payload_data(self, token: Any, key: Any) -> dict[str, Any]:
        """The ID token's claims, once its signature, issuer, audience, expiry and time of issue
        are checked (the library's own check is of the signature alone)."""
        algorithm = settings.OIDC_RP_SIGN_ALGO
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") != algorithm:
                raise _refuse(
                    self.request, f"the ID token is signed with {header.get('alg')}, not {algorithm}"
                )
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=settings.OIDC_RP_CLIENT_ID,
                issuer=settings.GRUNDLAG_OIDC_ISSUER,
                leeway=LEEWAY_SECONDS,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise _refuse(self.request, "the identity provider's ID token has expired") from None
        except jwt.InvalidAudienceError:
            raise _refuse(self.request, "the ID token is for another application (its audience)") from None
        except jwt.InvalidIssuerError:
            raise _refuse(self.request, "the ID token is from another issuer") from None
        except jwt.InvalidTokenError as exc:
            raise _refuse(self.request, f"the ID token is not valid: {exc}") from None
        # A token for several audiences must name this site as the one it was given to.
        if isinstance(claims.get("aud"), list) and claims.get("azp") != settings.OIDC_RP_CLIENT_ID:
            raise _refuse(self.request, "the ID token was given to another application (azp)")
        self.id_claims = claims
        return claims

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims, and the userinfo endpoint's where the provider has one (for
        the same subject: OpenID Connect Core, 5.3.2)."""
        claims = dict(payload)
        if provider().get("userinfo_endpoint"):
            more = super().get_userinfo(access_token, id_token, payload)
            if more.get("sub") != payload.get("sub"):
                raise _refuse(self.request, "the provider's userinfo is of another subject")
            claims.update({name: value for name, value in more.items() if name not in ("iss", "aud")})
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        users = get_user_model().objects
        found = users.filter(
            sign_in_identity__issuer=settings.GRUNDLAG_OIDC_ISSUER, sign_in_identity__subject=claims["sub"]
        )
        if not found.exists() and (provisioned := _provisioned(claims)) is not None:
            # The directory made their account first (SCIM): this sign-in is theirs, not a second one.
            SignInIdentity.objects.create(
                issuer=settings.GRUNDLAG_OIDC_ISSUER, subject=claims["sub"], user=provisioned
            )
        return users.filter(
            sign_in_identity__issuer=settings.GRUNDLAG_OIDC_ISSUER, sign_in_identity__subject=claims["sub"]
        )

    def create_user(self, claims: dict[str, Any]) -> Any:
        roles, managed = _roles_of(claims)
        if not roles and not _open_sign_up(managed):
            raise _refuse(self.request, _no_team(claims))
        try:
            with transaction.atomic():
                user = get_user_model().objects.create_user(_free_username(claims), email=_email(claims))
                SignInIdentity.objects.create(
                    issuer=settings.GRUNDLAG_OIDC_ISSUER,
                    subject=claims["sub"],
                    user=user,
                    last_signed_in_at=timezone.now(),
                )
        except IntegrityError:
            # The same person's first sign-in in another tab won the race: theirs is the user.
            raced = self.filter_users_by_claims(claims).first()
            if raced is None:
                raise
            return self.update_user(raced, claims)
        _update_profile(user, claims)
        engine.members.from_groups(user, roles, managed)
        logger.info("sign-in: made user %s for %s", user.get_username(), claims["sub"])
        return user

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        if not user.is_active:
            raise _refuse(self.request, "this account is disabled here")
        roles, managed = _roles_of(claims)
        # First: refused or not, they leave the teams their groups no longer open (mail links
        # and Slack need no session). Where the directory provisions them (SCIM), its groups
        # decide their teams, not the sign-in's.
        if not DirectoryResource.objects.filter(user=user).exists():
            engine.members.from_groups(user, roles, managed)
        if (
            not user.is_staff
            and not Membership.objects.filter(user=user).exists()
            and not _open_sign_up(managed)
        ):
            raise _refuse(self.request, _no_team(claims))
        _update_profile(user, claims)
        SignInIdentity.objects.filter(user=user).update(last_signed_in_at=timezone.now())
        return user


def _groups(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.GRUNDLAG_OIDC_GROUPS_CLAIM) or []
    if isinstance(value, str):
        value = [value]
    return [str(group) for group in value if isinstance(group, str | int)][:1000]


def _roles_of(claims: dict[str, Any]) -> tuple[dict[int, str], set[int]]:
    """What the person's groups make them, and the teams the provider manages."""
    return engine.members.roles_for(_groups(claims))


def _provisioned(claims: dict[str, Any]) -> Any:
    """The account the company's directory provisioned for this person (SCIM), not yet signed in
    with: its externalId is their subject; or, when it has none, its userName or email is their
    email, which the provider says is verified (a name a person may choose, never). Never a staff
    member's or a disabled one (those are linked by hand, in the admin)."""
    rows = DirectoryResource.objects.filter(
        resource_type="User",
        user__isnull=False,
        user__sign_in_identity=None,
        user__is_staff=False,
        user__is_superuser=False,
        user__is_active=True,
    ).select_related("user")
    for row in rows.filter(payload__externalId=claims["sub"])[:1]:
        return row.user
    email = str(claims.get("email") or "")
    if not email or claims.get("email_verified") is not True:
        return None
    unclaimed = rows.filter(~Q(payload__has_key="externalId") | Q(payload__externalId=""))
    found = list(unclaimed.filter(Q(user__username__iexact=email) | Q(user__email__iexact=email))[:2])
    return found[0].user if len(found) == 1 else None  # two: whose, nobody can say


def _open_sign_up(managed: set[int]) -> bool:
    """Whether someone their groups put in no team may still sign in: only where no group is
    mapped at all and the site says so (GRUNDLAG_OIDC_OPEN_SIGN_UP), for a team's admin to add
    them; otherwise anyone the provider accepts (any Google account, say) would get in."""
    return not managed and bool(settings.GRUNDLAG_OIDC_OPEN_SIGN_UP)


def _email(claims: dict[str, Any]) -> str:
    """Their email, unless the provider says it is not verified (mail and Slack find people
    by it)."""
    if claims.get("email_verified") is False:
        return ""
    return str(claims.get("email") or "")[:254]


def _no_team(claims: dict[str, Any]) -> str:
    groups = _groups(claims)
    said = ", ".join(groups[:10]) if groups else "none"
    return f"your account is in no group that opens a team here (your groups: {said}); ask your administrator"


# ASCII only: a username that looks like another's (a Cyrillic "а") is not taken from a claim.
_USERNAME = re.compile(r"[^A-Za-z0-9_.@+-]")


def _free_username(claims: dict[str, Any]) -> str:
    """The person's preferred username (or their email's local part), as Django's usernames
    may be, made unique by a number where another user has it already."""
    wanted = str(claims.get("preferred_username") or str(claims.get("email") or "").split("@")[0] or "user")
    base = _USERNAME.sub("", wanted)[:140] or "user"
    users = get_user_model().objects
    name, n = base, 1
    while users.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def _update_profile(user: Any, claims: dict[str, Any]) -> None:
    fields = {
        "email": _email(claims) or user.email,
        "first_name": str(claims.get("given_name") or user.first_name)[:150],
        "last_name": str(claims.get("family_name") or user.last_name)[:150],
    }
    if any(getattr(user, name) != value for name, value in fields.items()):
        for name, value in fields.items():
            setattr(user, name, value)
        user.save(update_fields=list(fields))


class _FromDiscovery:
    """The library's views, with the discovered endpoints, answering the sign-in page (503)
    when the provider cannot be reached, and sending to it when single sign-on is off."""

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        return _setting(attr, *args)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not enabled():
            return redirect("login")
        try:
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]
        except ProviderUnavailable as exc:
            logger.error("sign-in: %s", exc)
            return login_page(
                request, status=503, refused="the identity provider cannot be reached; try again later"
            )


class SignIn(_FromDiscovery, OIDCAuthenticationRequestView):
    """Off to the provider (with PKCE's challenge, a state and a nonce)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        View.__init__(self, *args, **kwargs)  # the endpoint is read when the request is

    @property
    def OIDC_OP_AUTH_ENDPOINT(self) -> str:  # noqa: N802 - the library's name
        return str(provider()["authorization_endpoint"])

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:  # noqa: N802
        return str(settings.OIDC_RP_CLIENT_ID)


class Callback(_FromDiscovery, OIDCAuthenticationCallbackView):
    """Back from the provider: signed in, or the sign-in page saying why not."""

    def get(self, request: HttpRequest) -> HttpResponse:
        # An error for no sign-in of this browser's (a link anyone can make): the library would
        # sign the person out; nothing is done.
        if request.GET.get("error") and request.GET.get("state") not in request.session.get(
            "oidc_states", {}
        ):
            return login_page(request, status=400, refused="the sign-in did not complete")
        return super().get(request)

    def login_failure(self) -> HttpResponse:
        why = getattr(self.request, "grundlag_sign_in_refused", "")
        if not why:
            # The provider's own words are not shown: only the OAuth error code, as a code.
            code = re.sub(r"[^a-z_]", "", self.request.GET.get("error", ""))[:40]
            why = f"the identity provider refused it ({code})" if code else "the sign-in did not complete"
        return login_page(self.request, status=403, refused=why)


def login_page(request: HttpRequest, *, status: int = 200, refused: str = "") -> HttpResponse:
    context = {
        "form": LoginForm(request),
        "refused": refused,
        "next": request.GET.get("next", ""),
    }
    return render(request, "registration/login.html", context, status=status)


class Login(LoginView):
    """The sign-in page: the provider's button when there is one, and the password form unless
    GRUNDLAG_PASSWORD_LOGIN is off (then a password is refused, whoever sends it: staff sign in
    with a link made on the server, manage.py signin_link)."""

    form_class = LoginForm

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.GRUNDLAG_PASSWORD_LOGIN:
            name = settings.GRUNDLAG_OIDC_NAME if enabled() else "your identity provider"
            return login_page(
                request, status=403, refused=f"password sign-in is off here: sign in with {name}"
            )
        return super().post(request, *args, **kwargs)


def provider_logout_url(request: HttpRequest) -> str:
    """Where logging out goes after the session here has ended: the provider's end of the
    session (RP-initiated logout), when it has one, back to the sign-in page."""
    fallback = reverse("login")
    if not enabled():
        return fallback
    try:
        end = provider().get("end_session_endpoint")
    except ProviderUnavailable:
        return fallback
    if not end:
        return fallback
    params = {
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(fallback),
    }
    if id_token := request.session.get("oidc_id_token"):
        params["id_token_hint"] = id_token
    return f"{end}{'&' if '?' in end else '?'}{urlencode(params)}"


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    """Ends the session here, then at the provider where it was begun there."""
    signed_in_there = "oidc_id_token" in request.session
    where = provider_logout_url(request) if signed_in_there else reverse("login")
    auth.logout(request)
    return HttpResponseRedirect(where)


# Break-glass: a staff member signs in with a link made on the server (manage.py signin_link),
# when the provider is down or password sign-in is off. Once: the link names the user's last
# sign-in, which signing in changes; and for a quarter of an hour.
LINK_SALT = "grundlag.sign-in-link"
LINK_SECONDS = 15 * 60


def sign_in_link_token(user: Any) -> str:
    last = user.last_login.isoformat() if user.last_login else ""
    return signing.dumps({"user": user.pk, "last": last}, salt=LINK_SALT, compress=True)


def link_sign_in(request: HttpRequest, token: str) -> HttpResponse:
    """GET says whose link it is (a mail scanner's GET signs nobody in); POST signs in."""
    try:
        data = signing.loads(token, salt=LINK_SALT, max_age=LINK_SECONDS)
    except signing.BadSignature:
        return login_page(request, status=403, refused="this sign-in link is not valid, or has expired")
    user = get_user_model().objects.filter(pk=data.get("user"), is_active=True, is_staff=True).first()
    last = user.last_login.isoformat() if user is not None and user.last_login else ""
    if user is None or data.get("last") != last:
        return login_page(
            request, status=403, refused="this sign-in link has been used, or its user cannot use it"
        )
    if request.method != "POST":
        return render(request, "registration/link.html", {"person": user})
    # Used once, whatever arrives at the same moment: the first to change the last sign-in wins.
    if (
        not get_user_model()
        .objects.filter(pk=user.pk, last_login=user.last_login)
        .update(last_login=timezone.now())
    ):
        return login_page(
            request, status=403, refused="this sign-in link has been used, or its user cannot use it"
        )
    auth.login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    logger.warning(
        "break-glass sign-in of %s by a link made on the server, from %s",
        user.get_username(),
        client_ip(request),
    )
    return redirect("inbox")
