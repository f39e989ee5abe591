"""The paper's kinematic relation (§3.2, Appendix B.1) and its comparison with the measured per-layer rotation.

A hidden state h receives a residual update of norm C at angle phi to h. Split into a part along h (C cos phi) and
one orthogonal to it (C sin phi), the state turns by the effective angle

    tan(theta_eff) = C sin(phi) / (||h|| + C cos(phi))

so that, for the same update, a token with a larger norm turns less ("representational inertia"). For one token
this is exact plane geometry. The paper's argument adds assumptions (§3.1): the update norm C^(l) and the angle phi
are the same for every token of a layer, whatever its modality. ``compare_rotation`` tests those assumptions: it
predicts each modality's rotation from the layer-wide C and phi and that modality's own mean norm, and sets the
prediction beside the measured mean rotation.
"""

from __future__ import annotations

import math

import torch

from .probes import pearson


def tan_theta_eff(h_norm, C, phi):
    """paper eq. (§3.2): tan(theta_eff) = C sin(phi) / (||h|| + C cos(phi)). Floats or tensors; phi in radians."""
    if isinstance(h_norm, torch.Tensor) or isinstance(C, torch.Tensor) or isinstance(phi, torch.Tensor):
        phi = torch.as_tensor(phi, dtype=torch.float64)
        return C * torch.sin(phi) / (h_norm + C * torch.cos(phi))
    return C * math.sin(phi) / (h_norm + C * math.cos(phi))


def theta_eff(h_norm, C, phi):
    """The rotation angle itself (radians, in [0, pi]): atan2 of the same two terms, defined also when the update
    points backwards far enough that ||h|| + C cos(phi) < 0."""
    if isinstance(h_norm, torch.Tensor) or isinstance(C, torch.Tensor) or isinstance(phi, torch.Tensor):
        phi = torch.as_tensor(phi, dtype=torch.float64)
        return torch.atan2(C * torch.sin(phi), h_norm + C * torch.cos(phi))
    return math.atan2(C * math.sin(phi), h_norm + C * math.cos(phi))


def _at(curve, index):
    value = curve[index]
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _predict(h_norm, C, phi_deg):
    if h_norm is None or C is None or phi_deg is None:
        return None
    return math.degrees(theta_eff(h_norm, C, math.radians(phi_deg)))


def compare_rotation(layers: dict, pooled: dict) -> dict:
    """Predicted vs measured rotation per layer l >= 1 and modality.

    ``layers``: the ``layers`` summary (modality -> statistic -> (L+1,) list). ``pooled``: the same statistics over
    all non-padding tokens of both modalities; its ``update_abs`` and ``update_angle_deg`` at layer l are the
    layer-wide C^(l) and phi^(l) of the paper's assumptions.

    predicted_rotation_deg[m][l]: theta_eff(||h_{l-1}|| of modality m, C^(l), phi^(l)), the paper's model.
    predicted_rotation_own_deg[m][l]: the same with modality m's own mean update norm and angle (no uniformity
        assumption; it differs from the measurement only by averaging before instead of after the formula).
    measured_rotation_deg[m][l]: the mean over tokens of the angle between h_{l-1} and h_l.
    """
    modalities = [m for m in ("vision", "text") if layers.get(m)]
    num = len(pooled["norm"])
    result = {
        "C": [None] + [_at(pooled["update_abs"], i) for i in range(1, num)],
        "phi_deg": [None] + [_at(pooled["update_angle_deg"], i) for i in range(1, num)],
        "predicted_rotation_deg": {},
        "predicted_rotation_own_deg": {},
        "measured_rotation_deg": {},
        "update_abs_vision_over_text": None,
    }
    predicted_all, measured_all = [], []
    for m in modalities:
        curves = layers[m]
        predicted = [None] + [
            _predict(_at(curves["norm"], i - 1), result["C"][i], result["phi_deg"][i]) for i in range(1, num)
        ]
        own = [None] + [
            _predict(_at(curves["norm"], i - 1), _at(curves["update_abs"], i), _at(curves["update_angle_deg"], i))
            for i in range(1, num)
        ]
        measured = [None] + [_at(curves["rotation_deg"], i) for i in range(1, num)]
        result["predicted_rotation_deg"][m] = predicted
        result["predicted_rotation_own_deg"][m] = own
        result["measured_rotation_deg"][m] = measured
        pairs = [(p, q) for p, q in zip(predicted, measured) if p is not None and q is not None]
        predicted_all += [p for p, _ in pairs]
        measured_all += [q for _, q in pairs]
    if "vision" in modalities and "text" in modalities:
        v, t = layers["vision"]["update_abs"], layers["text"]["update_abs"]
        result["update_abs_vision_over_text"] = [None] + [
            (_at(v, i) / _at(t, i)) if _at(v, i) is not None and _at(t, i) else None for i in range(1, num)
        ]
    if predicted_all:
        p, q = torch.tensor(predicted_all), torch.tensor(measured_all)
        result["correlation"] = pearson(p, q)
        result["mean_abs_error_deg"] = float((p - q).abs().mean())
    else:
        result["correlation"] = result["mean_abs_error_deg"] = None
    return result
