"""open_image: every PIL mode decoded by what its values mean, generated files of each kind checked pixel by pixel."""

import numpy as np
import pytest
from PIL import Image

from zoo.data.images.decode import ImageError, open_image


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image).astype(np.int64)


def test_a_16_bit_png_ramp_decodes_to_a_ramp_not_white(tmp_path):
    ramp = np.linspace(0, 65535, 37 * 5).reshape(5, 37).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    assert Image.open(tmp_path / "ramp.png").mode == "I;16"
    decoded = open_image(tmp_path / "ramp.png", mode="L")
    assert decoded.mode == "L" and decoded.size == (37, 5)
    np.testing.assert_allclose(pixels(decoded), ramp / 257, atol=0.5)
    assert (np.diff(pixels(decoded).ravel()) >= 0).all()


def test_a_12_bit_scan_stored_in_16_bits_reaches_white(tmp_path):
    values = np.array([[0, 1024, 2048, 4095]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "scan.tif")
    np.testing.assert_allclose(pixels(open_image(tmp_path / "scan.tif", mode="L"))[0], values[0] / 4095 * 255, atol=0.5)


def test_big_endian_16_bit_tiff(tmp_path):
    values = np.array([[0, 30000, 65535]], dtype=np.uint16)
    Image.frombytes("I;16B", (3, 1), values.astype(">u2").tobytes()).save(tmp_path / "be.tif")
    assert Image.open(tmp_path / "be.tif").mode == "I;16B"
    decoded = open_image(tmp_path / "be.tif")
    assert decoded.mode == "RGB"
    np.testing.assert_allclose(pixels(decoded)[0, :, 0], values[0] / 257, atol=0.5)


def test_32_bit_integers_by_bit_depth_and_negative_ones_by_range(tmp_path):
    Image.fromarray(np.array([[0, 100, 255]], dtype=np.int32)).save(tmp_path / "i8.tif")
    assert pixels(open_image(tmp_path / "i8.tif", mode="L")).tolist() == [[0, 100, 255]]
    Image.fromarray(np.array([[-1000, 0, 1000]], dtype=np.int32)).save(tmp_path / "signed.tif")
    assert pixels(open_image(tmp_path / "signed.tif", mode="L")).tolist() == [[0, 128, 255]]


def test_float_images_in_unit_range_scale_by_255_others_by_their_range(tmp_path):
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)).save(tmp_path / "unit.tif")
    assert pixels(open_image(tmp_path / "unit.tif", mode="L")).tolist() == [[0, 128, 255]]
    Image.fromarray(np.array([[-3.0, 1.0, 5.0]], dtype=np.float32)).save(tmp_path / "wide.tif")
    assert pixels(open_image(tmp_path / "wide.tif", mode="L")).tolist() == [[0, 128, 255]]


def test_non_finite_float_image_is_named(tmp_path):
    Image.fromarray(np.array([[0.0, np.nan]], dtype=np.float32)).save(tmp_path / "nan.tif")
    with pytest.raises(ImageError, match=r"nan\.tif: .*NaN or infinite"):
        open_image(tmp_path / "nan.tif")


def test_palette_colours_map_exactly(tmp_path):
    image = Image.fromarray(np.array([[0, 1], [2, 1]], dtype=np.uint8), "P")
    image.putpalette([10, 20, 30, 255, 0, 0, 0, 0, 255] + [0] * 759)
    image.save(tmp_path / "palette.png")
    decoded = pixels(open_image(tmp_path / "palette.png"))
    assert decoded[0, 0].tolist() == [10, 20, 30] and decoded[0, 1].tolist() == [255, 0, 0]
    assert decoded[1, 0].tolist() == [0, 0, 255]


def test_alpha_is_composited_on_black(tmp_path):
    rgba = np.array([[[200, 100, 50, 255], [200, 100, 50, 128], [200, 100, 50, 0]]], dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    decoded = pixels(open_image(tmp_path / "rgba.png"))
    np.testing.assert_allclose(decoded[0], [[200, 100, 50], [100, 50, 25], [0, 0, 0]], atol=1)
    la = np.array([[[240, 255], [240, 64], [240, 0]]], dtype=np.uint8)
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    np.testing.assert_allclose(pixels(open_image(tmp_path / "la.png", mode="L"))[0], [240, 60, 0], atol=1)


def test_transparent_palette_gif_takes_the_first_frame_on_black(tmp_path):
    frames = []
    for fill in (1, 2):
        frame = Image.fromarray(np.array([[0, fill], [fill, fill]], dtype=np.uint8), "P")
        frame.putpalette([255, 255, 255, 0, 255, 0, 0, 0, 255] + [0] * 759)
        frames.append(frame)
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], transparency=0, disposal=2)
    assert Image.open(tmp_path / "anim.gif").n_frames == 2
    decoded = pixels(open_image(tmp_path / "anim.gif"))
    # index 0 is transparent (black, not its white palette entry); the rest is frame 1's green, not frame 2's blue
    assert decoded[0, 0].tolist() == [0, 0, 0] and decoded[1, 1].tolist() == [0, 255, 0]


def test_multi_frame_tiff_gives_the_first_frame(tmp_path):
    frames = [Image.new("L", (4, 3), value) for value in (10, 200, 90)]
    frames[0].save(tmp_path / "stack.tif", save_all=True, append_images=frames[1:])
    decoded = open_image(tmp_path / "stack.tif", mode="L")
    assert decoded.size == (4, 3) and set(pixels(decoded).ravel()) == {10}


def test_cmyk_one_bit_and_grayscale_requests(tmp_path):
    cmyk = np.array([[[0, 0, 0, 0], [0, 255, 255, 0], [0, 0, 0, 255]]], dtype=np.uint8)
    Image.fromarray(cmyk, "CMYK").save(tmp_path / "cmyk.tif")
    assert pixels(open_image(tmp_path / "cmyk.tif"))[0].tolist() == [[255, 255, 255], [255, 0, 0], [0, 0, 0]]
    Image.fromarray(np.array([[True, False, True]])).save(tmp_path / "bits.png")
    assert Image.open(tmp_path / "bits.png").mode == "1"
    assert pixels(open_image(tmp_path / "bits.png", mode="L")).tolist() == [[255, 0, 255]]
    Image.new("RGB", (2, 2), (255, 0, 0)).save(tmp_path / "red.png")
    assert pixels(open_image(tmp_path / "red.png", mode="L")).tolist() == [[76, 76], [76, 76]]


def test_exif_orientation_is_applied(tmp_path):
    image = Image.new("RGB", (6, 2), (0, 0, 0))
    exif = image.getexif()
    exif[0x0112] = 6  # rotated 90 degrees: a viewer shows it 2 wide and 6 high
    image.save(tmp_path / "rotated.jpg", exif=exif)
    assert open_image(tmp_path / "rotated.jpg").size == (2, 6)


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("cut.png", "truncated", "cannot decode the image"),
        ("notes.png", b"just some text\n", "not an image file PIL can read"),
        ("empty.jpg", b"", "not an image file PIL can read"),
    ],
)
def test_unreadable_files_are_named(tmp_path, name, content, reason):
    if content == "truncated":
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "a.png")
        content = (tmp_path / "a.png").read_bytes()[:3000]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ImageError, match=f"{name}: {reason}") as caught:
        open_image(tmp_path / name)
    assert caught.value.path == str(tmp_path / name) and "\n" not in str(caught.value)


def test_missing_file_and_unknown_mode():
    with pytest.raises(ImageError, match="nowhere.png: no such file"):
        open_image("nowhere.png")
    with pytest.raises(ValueError, match="unknown image mode 'RGBA'.*known: L, RGB"):
        open_image("nowhere.png", mode="RGBA")
