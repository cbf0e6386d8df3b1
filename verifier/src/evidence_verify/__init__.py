"""evidence-verify: check an archive, a WACZ file, a proof or a checkpoint made by evidence.

It shares no code with evidence and needs neither it nor its database driver: an examiner
installs this package alone. Each ``check_*`` function returns a ``Verdict`` and never
raises on bad evidence (anything wrong is a problem in it); a file that cannot be read at
all, or a key that is not a key, raises ``VerifyError``.
"""

from .archive import check_archive
from .checkpoint import Checkpoint, VerifierKey, check_checkpoint, open_checkpoint
from .errors import VerifyError
from .proof import check_proof
from .verdict import Verdict
from .wacz import check_wacz

__all__ = ["Checkpoint", "Verdict", "VerifierKey", "VerifyError", "check_archive",
           "check_checkpoint", "check_proof", "check_wacz", "open_checkpoint"]
