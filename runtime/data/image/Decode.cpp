// Image decoding: PNG (libpng) and JPEG (libjpeg) only, converted to RGB as PIL's convert("RGB")
// does. Both libraries check the whole stream (CRCs, premature end of data), so an image that
// decodes has every pixel; the size from the header is checked against kMaxImagePixels before any
// pixel buffer is allocated. Other formats are named and refused: stb_image, used before, read
// dimensions it then allocated unchecked and filled truncated files with uninitialised pixels.
// libpng and libjpeg report errors by longjmp; the functions that call setjmp hold only trivially
// destructible locals, so no destructor is skipped.
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jpeglib.h>
#include <png.h>

#include "support/Error.h"
#include "support/InputFile.h"
#include "runtime/data/image/Image.h"

namespace dgemma {
namespace {


// Pixels with `channels` interleaved 8-bit samples (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) into RGB.
void toRgb(const uint8_t* src, int channels, int64_t count, uint8_t* dst) {
  for (int64_t i = 0; i < count; ++i, src += channels, dst += 3) {
    if (channels <= 2) {
      dst[0] = dst[1] = dst[2] = src[0];
    } else {
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
}

// A decoder's interleaved samples (1-4 channels) as an RGB image.
RgbImage rgbImageFrom(const uint8_t* samples, int channels, int64_t width, int64_t height) {
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(size_t(width * height * 3));
  toRgb(samples, channels, width * height, image.pixels.data());
  return image;
}

// ---- PNG ----

struct PngState {
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  size_t position = 0;
  char message[256] = {0};
  std::vector<uint8_t> raw;           // decoded rows, `channels` samples per pixel
  std::vector<png_bytep> rows;
  png_uint_32 width = 0, height = 0;
  int channels = 0;
};

void pngRead(png_structp png, png_bytep out, png_size_t length) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (state->size - state->position < length) png_error(png, "unexpected end of file (truncated image)");
  std::memcpy(out, state->bytes + state->position, length);
  state->position += length;
}

void pngError(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

void pngWarning(png_structp, png_const_charp) {}

// Returns false with state->message set on failure.
bool decodePngRaw(PngState* state) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, pngError, pngWarning);
  if (png == nullptr) {
    std::snprintf(state->message, sizeof(state->message), "libpng initialization failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(state->message, sizeof(state->message), "libpng initialization failed");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, state, pngRead);
  png_read_info(png, info);
  state->width = png_get_image_width(png, info);
  state->height = png_get_image_height(png, info);
  if (int64_t(state->width) * int64_t(state->height) > kMaxImagePixels) {
    std::snprintf(state->message, sizeof(state->message), "%u x %u pixels; expected at most %lld pixels",
                  unsigned(state->width), unsigned(state->height), static_cast<long long>(kMaxImagePixels));
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  int colorType = png_get_color_type(png, info);
  int bitDepth = png_get_bit_depth(png, info);
  if (colorType == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (colorType == PNG_COLOR_TYPE_GRAY && bitDepth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bitDepth == 16) png_set_strip_16(png);  // PIL keeps the high byte of 16-bit RGB(A)
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  state->channels = png_get_channels(png, info);
  size_t rowBytes = png_get_rowbytes(png, info);
  if (state->channels < 1 || state->channels > 4 || rowBytes != size_t(state->width) * state->channels) {
    png_error(png, "unsupported PNG pixel layout");
  }
  state->raw.resize(rowBytes * state->height);
  state->rows.resize(state->height);
  for (png_uint_32 y = 0; y < state->height; ++y) state->rows[y] = state->raw.data() + size_t(y) * rowBytes;
  png_read_image(png, state->rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

RgbImage decodePng(std::string_view bytes, const std::string& source) {
  PngState state;
  state.bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  state.size = bytes.size();
  if (!decodePngRaw(&state)) throw InputError(source + ": invalid PNG image: " + state.message);
  return rgbImageFrom(state.raw.data(), state.channels, state.width, state.height);
}

// ---- JPEG ----

// Standard layout, `manager` first: libjpeg hands back a pointer to it.
struct JpegErrorManager {
  jpeg_error_mgr manager;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
};

struct JpegState {
  JpegErrorManager error{};
  char* message = error.message;
  std::vector<uint8_t> raw;
  JDIMENSION width = 0, height = 0;
  int channels = 0;
};

void jpegErrorExit(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, error->message);
  std::longjmp(error->jump, 1);
}

// Warnings (premature end of data, corrupt entropy data) are errors: PIL refuses truncated JPEGs.
void jpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0) jpegErrorExit(cinfo);
}

bool decodeJpegRaw(std::string_view bytes, JpegState* state) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&state->error.manager);
  state->error.manager.error_exit = jpegErrorExit;
  state->error.manager.emit_message = jpegEmitMessage;
  if (setjmp(state->error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  // Before jpeg_start_decompress, which allocates by the header's size.
  if (int64_t(cinfo.image_width) * int64_t(cinfo.image_height) > kMaxImagePixels) {
    std::snprintf(state->message, sizeof(state->error.message), "%u x %u pixels; expected at most %lld pixels",
                  unsigned(cinfo.image_width), unsigned(cinfo.image_height), static_cast<long long>(kMaxImagePixels));
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  if (cinfo.jpeg_color_space == JCS_GRAYSCALE) {
    cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_RGB) {
    cinfo.out_color_space = JCS_RGB;
  } else {
    std::snprintf(state->message, sizeof(state->error.message), "unsupported JPEG color space (CMYK or YCCK)");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_start_decompress(&cinfo);
  state->width = cinfo.output_width;
  state->height = cinfo.output_height;
  state->channels = cinfo.output_components;
  if (state->channels < 1 || state->channels > 4) {
    std::snprintf(state->message, sizeof(state->error.message), "unsupported component count %d", state->channels);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  size_t rowBytes = size_t(state->width) * state->channels;
  state->raw.resize(rowBytes * state->height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = state->raw.data() + size_t(cinfo.output_scanline) * rowBytes;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

RgbImage decodeJpeg(std::string_view bytes, const std::string& source) {
  JpegState state;
  if (!decodeJpegRaw(bytes, &state)) throw InputError(source + ": invalid JPEG image: " + state.message);
  return rgbImageFrom(state.raw.data(), state.channels, state.width, state.height);
}

// ---- other formats ----

// `magic` at `offset` (a file shorter than offset + magic never matches).
bool hasAt(std::string_view bytes, size_t offset, std::string_view magic) {
  return bytes.size() >= offset + magic.size() && bytes.compare(offset, magic.size(), magic) == 0;
}
bool startsWith(std::string_view bytes, std::string_view magic) { return hasAt(bytes, 0, magic); }

// What a file that is neither PNG nor JPEG is, from its first bytes, for the message.
std::string describeOtherFormat(std::string_view bytes) {
  if (startsWith(bytes, "GIF87a") || startsWith(bytes, "GIF89a")) return "a GIF image";
  if (startsWith(bytes, "BM")) return "a BMP image";
  if (bytes.size() >= 2 && bytes[0] == 'P' && bytes[1] >= '1' && bytes[1] <= '7') {
    static const char* kNetpbm[] = {"PBM", "PGM", "PPM", "PBM", "PGM", "PPM", "PAM"};
    return std::string("a Netpbm (") + kNetpbm[bytes[1] - '1'] + ") image";
  }
  if (startsWith(bytes, std::string_view("II*\0", 4)) || startsWith(bytes, std::string_view("MM\0*", 4))) return "a TIFF image";
  if (startsWith(bytes, "RIFF") && hasAt(bytes, 8, "WEBP")) return "a WebP image";
  if (hasAt(bytes, 4, "ftyp")) return "an ISO media file (HEIF, AVIF or video)";
  if (startsWith(bytes, "8BPS")) return "a Photoshop (PSD) image";
  if (startsWith(bytes, "#?RADIANCE") || startsWith(bytes, "#?RGBE")) return "a Radiance HDR image";
  if (startsWith(bytes, "qoif")) return "a QOI image";
  std::string text = "a file of unknown format (it starts with";
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    char hex[8];
    std::snprintf(hex, sizeof hex, " %02x", static_cast<unsigned char>(bytes[i]));
    text += hex;
  }
  return text + ")";
}

}  // namespace

RgbImage decodeImageBytes(std::string_view bytes, const std::string& source) {
  if (bytes.empty()) throw InputError(source + ": expected a PNG or JPEG image, got an empty file");
  static const char kPng[8] = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
  RgbImage image;
  if (startsWith(bytes, std::string_view(kPng, 8))) {
    image = decodePng(bytes, source);
  } else if (startsWith(bytes, "\xFF\xD8\xFF")) {
    image = decodeJpeg(bytes, source);
  } else {
    throw InputError(source + ": expected a PNG or JPEG image, got " + describeOtherFormat(bytes) +
                     "; convert it to PNG (docs/data.md, \"JSONL rows\")");
  }
  if (image.width <= 0 || image.height <= 0) throw InputError(source + ": expected a non-empty image, got 0 pixels");
  return image;
}

RgbImage decodeImage(const std::string& path) {
  return decodeImageBytes(readRegularFile(path, kMaxImageFileBytes), path);
}

}  // namespace dgemma
