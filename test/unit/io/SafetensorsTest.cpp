#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/Error.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "dgemma-safetensors-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    directory_ = pattern;
  }
  void TearDown() override { fs::remove_all(directory_); }

  std::string pathOf(const std::string& name) const { return (directory_ / name).string(); }
  std::vector<std::string> filesInDirectory() const {
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(directory_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path directory_;
};

std::string fileBytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), {});
}

void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream stream(path, std::ios::binary);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file assembled without the writer: little-endian length, header text as given, data.
void writeRawSafetensors(const std::string& path, const std::string& header, const std::string& data) {
  std::string bytes;
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((length >> (8 * i)) & 0xff);
  writeBytes(path, bytes + header + data);
}

template <typename Action>
std::string inputErrorMessage(Action&& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

::testing::AssertionResult mentions(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << message << "' does not mention '" << part << "'";
}

HostTensor patterned(DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  HostTensor tensor(dtype, std::move(shape));
  for (size_t i = 0; i < tensor.data.size(); ++i) tensor.data[i] = static_cast<uint8_t>(seed + 37 * i);
  return tensor;
}

HostTensor floats(std::vector<int64_t> shape, std::vector<float> values) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::memcpy(tensor.data.data(), values.data(), tensor.data.size());
  return tensor;
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeIncludingScalarAndEmptyShapes) {
  HostTensor bf16(DType::BF16, {3});
  const float bf16Values[] = {1.5f, -2.25f, 3.0e8f};
  for (int i = 0; i < 3; ++i) bf16.as<uint16_t>()[i] = f32ToBf16Bits(bf16Values[i]);
  std::vector<HostTensor> tensors = {
      patterned(DType::F64, {2, 3}, 1), patterned(DType::F32, {4}, 2),
      patterned(DType::F16, {2, 2}, 3), bf16,
      patterned(DType::I64, {}, 5),     patterned(DType::I32, {0, 3}, 6),
      patterned(DType::I8, {5}, 7),     patterned(DType::U8, {1, 1, 2}, 8),
      patterned(DType::Bool, {2}, 9),
  };
  tensors.back().data = {0, 1};
  const std::vector<std::string> names = {"f64", "f32", "f16", "bf16", "i64_scalar", "i32_empty", "i8", "u8", "bool"};
  std::vector<std::pair<std::string, const HostTensor*>> toWrite;
  for (size_t i = 0; i < tensors.size(); ++i) toWrite.emplace_back(names[i], &tensors[i]);
  const std::string path = pathOf("all.safetensors");
  writeSafetensors(path, toWrite);

  SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const SafetensorsEntry& entry = file.entries()[i];  // data order is the order written
    EXPECT_EQ(entry.name, names[i]);
    EXPECT_EQ(entry.dtype, tensors[i].dtype);
    EXPECT_EQ(entry.shape, tensors[i].shape);
    EXPECT_EQ(entry.bytes, tensors[i].data.size());
    HostTensor read = file.read(names[i]);
    EXPECT_EQ(read.dtype, tensors[i].dtype);
    EXPECT_EQ(read.shape, tensors[i].shape);
    EXPECT_EQ(read.data, tensors[i].data);
  }
  HostTensor readBf16 = file.read("bf16");
  EXPECT_EQ(bf16BitsToF32(readBf16.as<uint16_t>()[1]), -2.25f);
  EXPECT_EQ(file.find("i64_scalar")->bytes, 8u);
  EXPECT_EQ(file.find("i32_empty")->bytes, 0u);
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_EQ(file.path(), path);
}

TEST_F(SafetensorsTest, WriterPadsHeaderAndLaysTensorsOutContiguouslyInOrder) {
  HostTensor zeta = patterned(DType::I8, {3}, 1);
  HostTensor alpha = patterned(DType::F64, {2}, 2);
  const std::string path = pathOf("layout.safetensors");
  // zeta is given first although its name sorts last. The unpadded header is 114 bytes.
  writeSafetensors(path, {{"zeta", &zeta}, {"alpha", &alpha}});

  const std::string bytes = fileBytes(path);
  uint64_t headerLength;
  std::memcpy(&headerLength, bytes.data(), 8);
  EXPECT_EQ(headerLength, 120u);
  EXPECT_EQ(bytes.substr(8 + 113, 7), "}      ");
  EXPECT_EQ(bytes.size(), 8 + headerLength + 3 + 16);
  EXPECT_EQ(bytes.substr(8 + headerLength, 3), std::string(zeta.data.begin(), zeta.data.end()));
  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.find("zeta")->offset, 0u);
  EXPECT_EQ(file.find("alpha")->offset, 3u);
  EXPECT_EQ(std::memcmp(file.data(*file.find("alpha")), alpha.data.data(), 16), 0);
}

TEST_F(SafetensorsTest, MetadataRoundTrips) {
  HostTensor tensor = patterned(DType::F32, {1}, 0);
  const std::string path = pathOf("meta.safetensors");
  writeSafetensors(path, {{"t", &tensor}}, {{"format", "pt"}, {"step", "12"}});
  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  EXPECT_EQ(file.entries().size(), 1u);
}

// The exact bytes Python's safetensors writes for save_file({"weight": [[1, 2], [3, 4]] (f32)},
// metadata={"format": "pt"}): metadata first, compact JSON padded with spaces to 96 bytes.
const std::string kPythonHeader =
    R"({"__metadata__":{"format":"pt"},"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}   )";
const unsigned char kPythonHeaderLength[] = {0x60, 0, 0, 0, 0, 0, 0, 0};  // 96, little-endian
// 1.0f, 2.0f, 3.0f, 4.0f
const unsigned char kPythonData[] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40};

std::string pythonFile() {
  std::string bytes(reinterpret_cast<const char*>(kPythonHeaderLength), sizeof kPythonHeaderLength);
  bytes += kPythonHeader;
  bytes.append(reinterpret_cast<const char*>(kPythonData), sizeof kPythonData);
  return bytes;
}

TEST_F(SafetensorsTest, ReadsAFileWrittenByteByByte) {
  ASSERT_EQ(kPythonHeader.size(), 96u);
  const std::string path = pathOf("python.safetensors");
  writeBytes(path, pythonFile());
  SafetensorsFile file = SafetensorsFile::open(path);
  HostTensor weight = file.read("weight");
  EXPECT_EQ(weight.dtype, DType::F32);
  EXPECT_EQ(weight.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::vector<float>(weight.as<float>(), weight.as<float>() + 4), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(file.metadata().at("format"), "pt");
}

TEST_F(SafetensorsTest, WriterProducesTheSameBytesAsPython) {
  HostTensor weight = floats({2, 2}, {1, 2, 3, 4});
  const std::string path = pathOf("ours.safetensors");
  writeSafetensors(path, {{"weight", &weight}}, {{"format", "pt"}});
  EXPECT_EQ(fileBytes(path), pythonFile());
}

struct RejectedHeader {
  std::string label;
  std::string header;
  size_t dataBytes;
  std::string tensor;       // the tensor the message must name
  std::string explanation;  // a fragment the message must contain
};

void PrintTo(const RejectedHeader& rejected, std::ostream* stream) { *stream << rejected.label; }

class SafetensorsRejectionTest : public SafetensorsTest, public ::testing::WithParamInterface<RejectedHeader> {};

TEST_P(SafetensorsRejectionTest, NamesPathTensorAndProblem) {
  const RejectedHeader& rejected = GetParam();
  const std::string path = pathOf("bad.safetensors");
  writeRawSafetensors(path, rejected.header, std::string(rejected.dataBytes, '\0'));
  std::string message = inputErrorMessage([&] { SafetensorsFile::open(path); });
  EXPECT_TRUE(mentions(message, path + ": tensor '" + rejected.tensor + "'"));
  EXPECT_TRUE(mentions(message, rejected.explanation));
}

INSTANTIATE_TEST_SUITE_P(
    Header, SafetensorsRejectionTest,
    ::testing::Values(
        RejectedHeader{"NotAnObject", R"({"x":[1]})", 0, "x", "expected an object"},
        RejectedHeader{"MissingDType", R"({"x":{"shape":[1],"data_offsets":[0,4]}})", 4, "x", "dtype"},
        RejectedHeader{"DTypeNotString", R"({"x":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4, "x", "dtype"},
        RejectedHeader{"UnknownDType", R"({"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1, "x",
                       "'F8_E4M3' is not supported"},
        RejectedHeader{"MissingShape", R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", 4, "x", "shape"},
        RejectedHeader{"ShapeNotArray", R"({"x":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", 4, "x", "shape"},
        RejectedHeader{"FractionalDim", R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "x", "shape"},
        RejectedHeader{"NegativeDim", R"({"x":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", 4, "x",
                       "dimension 1 is -1"},
        RejectedHeader{"OverflowingShape",
                       R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4, "x",
                       "dimension 1 (4294967296) makes the tensor larger than 2^64 bytes"},
        // Issue 15: an empty tensor may not hide dimensions whose product overflows.
        RejectedHeader{"EmptyTensorWithOverflowingDims",
                       R"({"x":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}})",
                       0, "x", "dimension 1 (4611686018427387904) makes the tensor larger than 2^64 bytes"},
        RejectedHeader{"TooManyDimensions",
                       R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1,
                       "x", "shape: 17 dimensions, expected at most 16"},
        RejectedHeader{"MissingOffsets", R"({"x":{"dtype":"F32","shape":[1]}})", 4, "x", "data_offsets"},
        RejectedHeader{"OneOffset", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", 4, "x",
                       "data_offsets: expected [begin, end]"},
        RejectedHeader{"NegativeOffset", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "x",
                       "data_offsets: expected [begin, end]"},
        RejectedHeader{"EndBeforeBegin", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8, "x",
                       "end is before begin"},
        RejectedHeader{"WrongByteCount", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8, "x",
                       "needs 8"},
        RejectedHeader{"BeyondData", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8, "x",
                       "beyond the data region (8 bytes)"},
        RejectedHeader{"Overlap",
                       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("x":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                       12, "x", "overlap tensor 'a' [0,8]"},
        RejectedHeader{"RepeatedName",
                       R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                       2, "x", "appears twice"}),
    [](const ::testing::TestParamInfo<RejectedHeader>& info) { return info.param.label; });

TEST_F(SafetensorsTest, RejectsMalformedFilesNamingThePath) {
  struct Case {
    std::string bytes;
    std::string explanation;
  };
  std::string headerTooLong(8, '\0');
  headerTooLong[0] = 100;
  const Case cases[] = {
      {std::string("\x02\0\0", 3), "too short for the 8-byte header length"},
      {headerTooLong + "{}", "length 100 extends beyond the end of the file (10 bytes)"},
      {std::string("\x05\0\0\0\0\0\0\0", 8) + "{\"x\":", "invalid JSON"},
      {std::string("\x02\0\0\0\0\0\0\0", 8) + "[]", "expected a JSON object"},
      {std::string("\x1b\0\0\0\0\0\0\0", 8) + R"({"__metadata__":{"step":1}})", "__metadata__: expected an object"},
  };
  const std::string path = pathOf("malformed.safetensors");
  for (const Case& malformed : cases) {
    SCOPED_TRACE(malformed.explanation);
    writeBytes(path, malformed.bytes);
    std::string message = inputErrorMessage([&] { SafetensorsFile::open(path); });
    EXPECT_TRUE(mentions(message, path + ": "));
    EXPECT_TRUE(mentions(message, malformed.explanation));
  }
  EXPECT_TRUE(mentions(inputErrorMessage([&] { SafetensorsFile::open(pathOf("absent.safetensors")); }),
                       pathOf("absent.safetensors") + ": cannot open"));
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  HostTensor first = patterned(DType::F32, {4}, 0);
  HostTensor last = patterned(DType::F32, {4}, 1);
  const std::string path = pathOf("truncated.safetensors");
  writeSafetensors(path, {{"first", &first}, {"last", &last}});
  fs::resize_file(path, fs::file_size(path) - 1);
  std::string message = inputErrorMessage([&] { SafetensorsFile::open(path); });
  EXPECT_TRUE(mentions(message, path + ": tensor 'last'"));
  EXPECT_TRUE(mentions(message, "beyond the data region"));
}

TEST_F(SafetensorsTest, ReadingAMissingTensorNamesIt) {
  HostTensor tensor = patterned(DType::U8, {2}, 0);
  const std::string path = pathOf("one.safetensors");
  writeSafetensors(path, {{"present", &tensor}});
  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.find("absent"), nullptr);
  EXPECT_TRUE(mentions(inputErrorMessage([&] { file.read("absent"); }), path + ": tensor 'absent': not found"));
}

TEST_F(SafetensorsTest, MovedFileKeepsItsMapping) {
  HostTensor tensor = patterned(DType::I32, {3}, 4);
  const std::string path = pathOf("move.safetensors");
  writeSafetensors(path, {{"t", &tensor}});
  SafetensorsFile original = SafetensorsFile::open(path);
  SafetensorsFile moved(std::move(original));
  SafetensorsFile assigned = SafetensorsFile::open(path);
  assigned = std::move(moved);
  EXPECT_EQ(assigned.read("t").data, tensor.data);
}

TEST_F(SafetensorsTest, DirectoryFollowsTheIndexWeightMap) {
  HostTensor a = patterned(DType::F32, {2}, 1), b = patterned(DType::I64, {1}, 2), c = patterned(DType::U8, {3}, 3);
  writeSafetensors(pathOf("model-00001-of-00002.safetensors"), {{"a", &a}, {"b", &b}});
  writeSafetensors(pathOf("model-00002-of-00002.safetensors"), {{"c", &c}});
  // A stray file the index does not name is not read.
  writeBytes(pathOf("stray.safetensors"), "not a safetensors file");
  writeBytes(pathOf("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 27}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"}})");

  SafetensorsDirectory directory = SafetensorsDirectory::open(directory_.string());
  EXPECT_EQ(directory.names(), (std::vector<std::string>{"a", "c"}));
  EXPECT_TRUE(directory.contains("c"));
  EXPECT_FALSE(directory.contains("b"));  // in a shard, but not in the weight map
  EXPECT_EQ(directory.read("a").data, a.data);
  EXPECT_EQ(directory.read("c").data, c.data);
  std::optional<SafetensorsLocation> location = directory.find("c");
  ASSERT_TRUE(location);
  EXPECT_EQ(location->file->path(), pathOf("model-00002-of-00002.safetensors"));
  EXPECT_EQ(location->entry->shape, (std::vector<int64_t>{3}));
  EXPECT_FALSE(directory.find("b"));
  EXPECT_TRUE(mentions(inputErrorMessage([&] { directory.read("b"); }), "tensor 'b': not found"));
}

TEST_F(SafetensorsTest, IndexMappingATensorToTheWrongShardIsRejected) {
  HostTensor a = patterned(DType::F32, {2}, 1);
  writeSafetensors(pathOf("shard1.safetensors"), {{"a", &a}});
  writeSafetensors(pathOf("shard2.safetensors"), {});
  writeBytes(pathOf("model.safetensors.index.json"), R"({"weight_map": {"a": "shard2.safetensors"}})");
  std::string message = inputErrorMessage([&] { SafetensorsDirectory::open(directory_.string()); });
  EXPECT_TRUE(mentions(message, pathOf("model.safetensors.index.json")));
  EXPECT_TRUE(mentions(message, "tensor 'a': mapped to 'shard2.safetensors', which does not contain it"));
}

TEST_F(SafetensorsTest, DirectoryWithoutIndexReadsEverySafetensorsFile) {
  HostTensor a = patterned(DType::F32, {2}, 1), b = patterned(DType::BF16, {2}, 2);
  writeSafetensors(pathOf("b.safetensors"), {{"b", &b}});
  writeSafetensors(pathOf("a.safetensors"), {{"a", &a}});
  writeBytes(pathOf("config.json"), "{}");
  SafetensorsDirectory directory = SafetensorsDirectory::open(directory_.string());
  EXPECT_EQ(directory.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(directory.read("b").data, b.data);
  EXPECT_EQ(directory.find("a")->file->path(), pathOf("a.safetensors"));

  SafetensorsDirectory single = SafetensorsDirectory::open(pathOf("b.safetensors"));
  EXPECT_EQ(single.names(), (std::vector<std::string>{"b"}));
}

TEST_F(SafetensorsTest, TensorInTwoFilesIsRejected) {
  HostTensor a = patterned(DType::F32, {2}, 1);
  writeSafetensors(pathOf("first.safetensors"), {{"shared", &a}});
  writeSafetensors(pathOf("second.safetensors"), {{"shared", &a}});
  std::string message = inputErrorMessage([&] { SafetensorsDirectory::open(directory_.string()); });
  EXPECT_TRUE(
      mentions(message, directory_.string() + ": tensor 'shared': in both first.safetensors and second.safetensors"));
}

TEST_F(SafetensorsTest, DirectoryWithoutCheckpointIsRejected) {
  writeBytes(pathOf("config.json"), "{}");
  EXPECT_TRUE(mentions(inputErrorMessage([&] { SafetensorsDirectory::open(directory_.string()); }),
                       directory_.string() + ": no .safetensors files"));
  EXPECT_TRUE(mentions(inputErrorMessage([&] { SafetensorsDirectory::open(pathOf("missing")); }),
                       pathOf("missing") + ": no such file or directory"));
}

TEST_F(SafetensorsTest, WriterRejectsBadTensorsWithoutTouchingTheTarget) {
  const std::string path = pathOf("target.safetensors");
  writeBytes(path, "previous contents");
  HostTensor tensor = patterned(DType::F32, {2}, 1);
  HostTensor shortData = patterned(DType::F32, {2}, 1);
  shortData.data.pop_back();
  EXPECT_THROW(writeSafetensors(path, {{"t", &tensor}, {"t", &tensor}}), std::invalid_argument);
  EXPECT_THROW(writeSafetensors(path, {{"t", &shortData}}), std::invalid_argument);
  EXPECT_THROW(writeSafetensors(path, {{"__metadata__", &tensor}}), std::invalid_argument);
  EXPECT_THROW(writeSafetensors(path, {{"t", nullptr}}), std::invalid_argument);
  EXPECT_EQ(fileBytes(path), "previous contents");
  EXPECT_EQ(filesInDirectory(), std::vector<std::string>{"target.safetensors"});
}

TEST_F(SafetensorsTest, FailedWriteLeavesNoTemporaryFile) {
  HostTensor tensor = patterned(DType::F32, {2}, 1);
  // Missing directory: the temporary file cannot even be created.
  EXPECT_THROW(writeSafetensors(pathOf("missing/out.safetensors"), {{"t", &tensor}}), RuntimeError);
  // The target is a directory: refused before anything is written (support/AtomicFile.h: only
  // regular files are replaced).
  fs::create_directory(pathOf("occupied.safetensors"));
  EXPECT_THROW(writeSafetensors(pathOf("occupied.safetensors"), {{"t", &tensor}}), InputError);
  EXPECT_TRUE(fs::is_directory(pathOf("occupied.safetensors")));
  EXPECT_EQ(filesInDirectory(), std::vector<std::string>{"occupied.safetensors"});

  writeSafetensors(pathOf("good.safetensors"), {{"t", &tensor}});
  EXPECT_EQ(filesInDirectory(), (std::vector<std::string>{"good.safetensors", "occupied.safetensors"}));
}

// Issue 15: headers and index files are parsed with the nesting bound of support/Json.h.
TEST_F(SafetensorsTest, DeeplyNestedHeadersAndIndexesAreRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string path = pathOf("deep.safetensors");
  writeRawSafetensors(path, "{\"__metadata__\":" + deep + "}", "");
  EXPECT_EQ(inputErrorMessage([&] { SafetensorsFile::open(path); }), path + ": header: JSON nested deeper than 64 levels");
  fs::remove(path);
  writeBytes(pathOf("model.safetensors.index.json"), "{\"weight_map\":" + deep + "}");
  EXPECT_EQ(inputErrorMessage([&] { SafetensorsDirectory::open(directory_.string()); }),
            pathOf("model.safetensors.index.json") + ": JSON nested deeper than 64 levels");
}

// Found by fuzzing: nlohmann reports 1e400 as out_of_range, and a NUL would end the header early.
TEST_F(SafetensorsTest, HugeNumbersAndNulBytesInTheHeaderAreInputErrors) {
  const std::string path = pathOf("huge.safetensors");
  writeRawSafetensors(path, "{\"__metadata__\": {\"x\": 1e400}}", "");
  EXPECT_EQ(inputErrorMessage([&] { SafetensorsFile::open(path); }).rfind(path + ": header: invalid JSON: ", 0), 0u);
  fs::remove(path);
  writeRawSafetensors(path, std::string("{}\0{\"a\": 1}", 10), "");
  EXPECT_EQ(inputErrorMessage([&] { SafetensorsFile::open(path); }), path + ": header: invalid JSON at byte 3: a NUL byte");
}

TEST_F(SafetensorsTest, IndexShardsMustBeFilesBesideTheIndex) {
  HostTensor a = patterned(DType::F32, {2}, 1);
  fs::create_directories(pathOf("model"));
  writeSafetensors(pathOf("outside.safetensors"), {{"a", &a}});
  writeBytes(pathOf("model/model.safetensors.index.json"), R"({"weight_map": {"a": "../outside.safetensors"}})");
  EXPECT_EQ(inputErrorMessage([&] { SafetensorsDirectory::open(pathOf("model")); }),
            pathOf("model/model.safetensors.index.json") + ": weight_map: tensor 'a': expected a file name in " +
                pathOf("model") + ", got \"../outside.safetensors\"");
}

// Names from a file reach messages escaped and cut.
TEST_F(SafetensorsTest, ControlCharactersInNamesAreEscaped) {
  const std::string path = pathOf("names.safetensors");
  writeRawSafetensors(path, "{\"a\\u001b[2J\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x");
  EXPECT_EQ(inputErrorMessage([&] { SafetensorsFile::open(path); }),
            path + ": tensor \"a\\x1b[2J\": dtype: 'F8' is not supported (expected one of F64, F32, F16, BF16, I64, I32, "
                   "I8, U8, BOOL)");
}

// The fuzz target's entry: the same checks on bytes in memory.
TEST_F(SafetensorsTest, ParsesAHeaderFromBytes) {
  HostTensor a = patterned(DType::F32, {2, 3}, 1);
  writeSafetensors(pathOf("a.safetensors"), {{"a", &a}}, {{"step", "3"}});
  const SafetensorsHeader header = parseSafetensorsHeader(fileBytes(pathOf("a.safetensors")), "memory");
  ASSERT_EQ(header.entries.size(), 1u);
  EXPECT_EQ(header.entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(header.metadata.at("step"), "3");
  EXPECT_EQ(inputErrorMessage([&] { parseSafetensorsHeader(std::string("\x02\0\0\0\0\0\0\0[]", 10), "memory"); }),
            "memory: header: expected a JSON object, got an array of 0 elements");
}

}  // namespace
}  // namespace dgemma
